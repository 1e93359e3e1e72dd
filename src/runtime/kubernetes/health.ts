/**
 * The Kubernetes runtime's `/health` facts: whether the API answers with our role, gVisor's
 * RuntimeClass, the informers, the canaries' verdicts and leadership. Cached by the caller.
 */
import type { Config } from '../../config.ts';
import type { KubeApi } from '../../kube/index.ts';
import type { LeadershipStatus, RuntimeHealth } from '../runtime.ts';
import { NetworkCheck } from './checks/network-check.ts';
import type { Preflight } from './checks/preflight.ts';
import { LABELS } from './names.ts';
import type { RunController } from './runs/controller.ts';
import type { RuntimeClassLookup } from './runtime-class.ts';

export interface HealthDeps {
  api: KubeApi;
  config: Config;
  runtimeClass: RuntimeClassLookup;
  controller: RunController;
  preflight: Preflight | null;
  networkCheck: NetworkCheck | null;
  leadership: LeadershipStatus;
}

export async function runtimeHealth(d: HealthDeps): Promise<RuntimeHealth> {
  const ns = d.config.kubernetes.runs_namespace;
  let available = false;
  let error: string | undefined;
  try {
    // Listing Jobs proves the API answers and that our role in the runs namespace works.
    await d.api.listJobs(ns, `${LABELS.instance}=${d.config.kubernetes.instance}`, 1);
    available = true;
  } catch (err) {
    error = err instanceof Error ? err.message : String(err);
  }
  const gvisor = (available ? await d.runtimeClass.refresh(true) : d.runtimeClass.exists) === true;
  const pf = d.preflight?.result;
  const problems = [
    ...(pf && (pf.status === 'failed' || pf.status === 'inconclusive') ? [`preflight ${pf.status}: ${pf.reason}`] : []),
    ...(d.networkCheck ? [NetworkCheck.problem(d.networkCheck.result)].filter((p): p is string => p !== null) : []),
  ];
  return {
    available,
    gvisorAvailable: gvisor,
    engine: 'kubernetes',
    isolated: true,
    limits: 'kubernetes',
    detail: {
      runs_namespace: ns,
      runtime_class: d.config.kubernetes.runtime_class,
      informers_synced: d.controller.pods.synced && d.controller.jobs.synced,
      runs_in_flight: d.controller.inFlight,
      leader: d.leadership,
      ...(d.preflight ? { preflight: d.preflight.result } : {}),
      ...(d.networkCheck ? { network_check: d.networkCheck.result } : {}),
      ...(error ? { error } : {}),
    },
    ...(problems.length > 0 ? { problems } : {}),
  };
}
