/**
 * The Kubernetes client layer: configuration loading, the typed API calls, a reconnecting informer
 * and exec over WebSocket. It knows nothing of runs or job types (runtime/kubernetes and jobtypes
 * build on it). Its calls go through no breaker and no retry (the service guards whole run attempts);
 * the informer reconnects with its own backoff and never touches the breaker.
 */
export { defaultKubeConfig } from './kube-config.ts';
export { KubeApi, httpStatusOf } from './kube-api.ts';
export { ReconnectingInformer, isGone, type InformerEvent, type InformerOptions, type KubeObject, type ListResult } from './informer.ts';
export { execInContainer, exitCodeOf, ExecError, EXEC_PROTOCOLS, type ExecRequest, type ExecResult, type ExecStatus } from './exec.ts';
