/**
 * The Kubernetes client layer: configuration loading, the typed API calls, a reconnecting informer
 * exec over WebSocket, and leader election over a Lease. It knows nothing of runs or job types (runtime/kubernetes and jobtypes
 * build on it). Its calls go through no breaker and no retry (the service guards whole run attempts);
 * the informer reconnects with its own backoff and never touches the breaker. Every request has a
 * deadline: calls, exec upgrades, watch headers, and watches themselves (past `timeoutSeconds`).
 */
export { defaultKubeConfig } from './kube-config.ts';
export { KubeApi, KubeTimeoutError, httpStatusOf, isApiUnavailable, DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_EXEC_TIMEOUT_MS } from './kube-api.ts';
export { ReconnectingInformer, isGone, watchDeadlineMs, DEFAULT_WATCH_TIMEOUT_SECONDS, type InformerEvent, type InformerOptions, type KubeObject, type ListResult } from './informer.ts';
export { execInContainer, exitCodeOf, ExecError, EXEC_PROTOCOLS, upgradeRefused, type ExecRequest, type ExecResult, type ExecStatus } from './exec.ts';
export { followLog, LogHttpError, type LogFollowHandle, type LogFollowRequest } from './log-stream.ts';
export { openWatch, WatchStalledError, WatchConnectTimeoutError, WatchHttpError, type WatchHandle, type WatchRequest } from './watch.ts';
export { attachToContainer, type AttachRequest, type AttachSession } from './attach.ts';
export { LeaderElector, kubeLeaseStore, type LeaseStore, type LeaseApi, type LeaderElectorOptions } from './leader-elector.ts';
export { DEFAULT_TIMING, decideLease, type ElectionTiming, type LeaseRecord } from './lease-decide.ts';
