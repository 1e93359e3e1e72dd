/**
 * Starts the runtime's canaries beside the service (`kubernetes.preflight`): the preflight
 * (preflight.ts) and, with `kubernetes.network_check_service`, the network check (network-check.ts).
 * Their verdicts show in the runtime's health; `onVerdict` is called when each has one.
 */
import type { V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import { NetworkCheck } from './network-check.ts';
import { Preflight } from './preflight.ts';

/** What the canaries need from the runtime. */
export interface CanaryDeps {
  api: KubeApi;
  config: Config;
  clock: Clock;
  log: Logger;
  /** The run pods the informer holds (the canaries' pods are among them). */
  pods: () => V1Pod[];
  /** The RuntimeClass a run gets now (null: none; false: none may run). */
  runtimeClassName: () => Promise<string | null | false>;
  onVerdict: () => void;
  timeoutMs?: number;
  networkCheckRetrySec?: number;
}

/** Starts the canaries; null fields are canaries that do not run. */
export async function startCanaries(d: CanaryDeps): Promise<{ preflight: Preflight | null; networkCheck: NetworkCheck | null }> {
  // The class the runs would get; strict mode without it refuses runs already (health says so).
  const runtimeClassName = await d.runtimeClassName().catch(() => null);
  if (runtimeClassName === false) return { preflight: null, networkCheck: null };
  const common = {
    createJob: (job: Parameters<KubeApi['createJob']>[0]) => d.api.createJob(job),
    deleteJob: (ns: string, name: string) => d.api.deleteJob(ns, name),
    findPod: (jobName: string) => d.pods().find((p) => p.metadata?.labels?.['job-name'] === jobName),
    clock: d.clock,
    log: d.log,
    config: d.config,
    runtimeClassName,
    ...(d.timeoutMs !== undefined ? { timeoutMs: d.timeoutMs } : {}),
  };
  const preflight = new Preflight(common);
  void preflight.run().then(d.onVerdict);
  const service = d.config.kubernetes.network_check_service;
  if (!service) return { preflight, networkCheck: null };
  const networkCheck = new NetworkCheck({
    ...common,
    serviceAddress: () => d.api.serviceAddress(d.config.kubernetes.namespace, service),
    runtimeClassExists: (name) => d.api.runtimeClassExists(name),
    ...(d.networkCheckRetrySec !== undefined ? { retrySec: d.networkCheckRetrySec } : {}),
  });
  void networkCheck.run().then(d.onVerdict);
  return { preflight, networkCheck };
}
