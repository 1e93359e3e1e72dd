/**
 * The steps of a cluster run for its trace, from what was observed: the Job/pod create (from the run's
 * start to the pod's creation), the scheduling wait (the pod's creation to its `PodScheduled`
 * condition) and the hand-over through attach (to the runner's `execution`). Pod times are the API
 * server's (second precision); the run's own are this process's clock. Pure: table-tested.
 */
import type { V1Pod } from '@kubernetes/client-node';
import type { ObservedStep } from '../../runtime.ts';
import { toMs, type RunState } from './decide.ts';

/** Span names of the cluster's steps. */
export const KUBE_STEPS = { create: 'sandpod.kube.create', schedule: 'sandpod.kube.schedule', attach: 'sandpod.kube.attach' } as const;

/** The steps of `run` observed so far (a claimed pool pod was created and scheduled before the run: no create or schedule). */
export function observedSteps(run: RunState, pod: V1Pod | undefined): ObservedStep[] {
  const out: ObservedStep[] = [];
  const podName = pod?.metadata?.name;
  const attrs = (extra: Record<string, string> = {}) => ({ 'k8s.job.name': run.jobName, ...(podName ? { 'k8s.pod.name': podName } : {}), ...extra });
  if (!run.claimed) {
    // A pod made for the run is not older than it: a creation time that reads earlier was truncated
    // to its second by the API server.
    const createdAt = toMs(pod?.metadata?.creationTimestamp);
    if (createdAt !== null) {
      const created = Math.max(run.startedAt, createdAt);
      out.push({ name: KUBE_STEPS.create, start: new Date(run.startedAt), end: new Date(created), attributes: attrs() });
      const scheduled = pod?.status?.conditions?.find((c) => c.type === 'PodScheduled' && c.status === 'True');
      const at = toMs(scheduled?.lastTransitionTime);
      if (at !== null) out.push({ name: KUBE_STEPS.schedule, start: new Date(created), end: new Date(Math.max(created, at)), attributes: attrs(pod?.spec?.nodeName ? { 'k8s.node.name': pod.spec.nodeName } : {}) });
    }
  }
  const w = run.warm;
  if (w?.deliveredAt !== null && w?.deliveredAt !== undefined) {
    const from = w.handOverAt ?? run.startedAt;
    out.push({ name: KUBE_STEPS.attach, start: new Date(from), end: new Date(Math.max(from, w.deliveredAt)), attributes: attrs({ 'sandpod.kube.path': run.claimed ? 'warm' : 'cold-attach' }) });
  }
  return out;
}
