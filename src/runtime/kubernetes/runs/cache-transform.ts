/**
 * What the run controller's informers keep of each object (client-go's informer transform). A real
 * API server puts `metadata.managedFields` (server-side apply's record of who set which field) on
 * every object; nothing here reads it, and it is a good part of what a cached run costs. Pods also
 * lose their containers' command, args and env: readers of a cached pod look at its metadata, its
 * `spec.nodeName` and its status, and a pod is only ever patched, never written back whole.
 * Jobs keep their spec: a pool claim writes the cached Job back with a replace (pool.ts), and a
 * replace without `managedFields` leaves the server's own unchanged.
 */
import type { V1Container, V1Job, V1Pod } from '@kubernetes/client-node';

function slimContainers(cs: V1Container[] | undefined): V1Container[] | undefined {
  return cs?.map(({ command: _c, args: _a, env: _e, ...rest }) => rest);
}

/** A pod as the cache keeps it (a new object; the input is not changed). */
export function slimPod(pod: V1Pod): V1Pod {
  const { managedFields: _m, ...metadata } = pod.metadata ?? {};
  if (!pod.spec) return { ...pod, metadata };
  const spec = { ...pod.spec, containers: slimContainers(pod.spec.containers) ?? [] };
  const init = slimContainers(pod.spec.initContainers);
  if (init) spec.initContainers = init;
  return { ...pod, metadata, spec };
}

/** A Job as the cache keeps it. */
export function slimJob(job: V1Job): V1Job {
  if (!job.metadata?.managedFields) return job;
  const { managedFields: _m, ...metadata } = job.metadata;
  return { ...job, metadata };
}
