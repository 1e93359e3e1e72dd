/**
 * The Job an earlier holder of an execution left, found before anything new is made for it: one
 * execution has at most one pod running its program. Adoption (the previous holder died or was
 * taken over) re-attaches to it; so does a fresh attempt that finds one (an execution given back to
 * the queue while the pod of an earlier attempt still exists — without this, a warm claim would
 * start the program on a second pod). A Job whose program goes by attach and never reached its pod
 * ran nothing: it is deleted and the run starts again — an adoption through the queue (the record
 * goes back), a fresh attempt at once, once the Job is gone (its own failed hand-over of a moment ago
 * is the common case: failing the attempt for it would use up a retry on nothing).
 */
import type { V1Job } from '@kubernetes/client-node';
import type { KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import { RunGoneError } from '../../runtime.ts';
import { jobGone } from './run-objects.ts';
import { LABELS, instanceSelector } from '../names.ts';
import type { AttachedRuns } from './attached.ts';
import type { RunController } from './controller.ts';

/** What {@link earlierJob} reads and deletes with. */
export interface EarlierJobDeps {
  api: KubeApi;
  controller: RunController;
  attached: AttachedRuns;
  ns: string;
  instance: string;
  log: Logger;
}

/**
 * The Job to re-attach to for execution `executionId` (label value `key`, cold Job name `jobName`):
 * - `adopt`: by its name, else the Job labelled with the execution (a claimed pool Job) from the
 *   cache, else from the API server; none → {@link RunGoneError};
 * - otherwise: a live (not deleting) Job labelled with the execution in the cache (with
 *   `earlierAttempts`, from the API server when the cache has none), or null.
 * `held` rejects (FencedError) when the run is no longer this process's: checked before anything
 * is fenced or deleted.
 * A Job whose program never reached its pod is deleted: {@link RunGoneError} when adopting;
 * otherwise, once the API server no longer has it, null (the attempt starts clean), or a retryable
 * error when it is still there after a while.
 */
export async function earlierJob(d: EarlierJobDeps, executionId: string, key: string, jobName: string, adopt: boolean, held: () => Promise<void>, earlierAttempts = false): Promise<V1Job | null> {
  const labelled = d.controller.jobs.byIndex(key);
  let job: V1Job | null | undefined;
  if (adopt) {
    job =
      (await d.api.getJob(d.ns, jobName)) ??
      labelled[0] ??
      (await d.api.listJobs(d.ns, `${instanceSelector(d.instance)},${LABELS.executionId}=${key}`)).items[0];
    if (!job) throw new RunGoneError(`no Job ${jobName} for execution ${executionId}`);
  } else {
    job = labelled.find((j) => !j.metadata?.deletionTimestamp);
    // Claimed before: an earlier attempt's Job (a claimed pool Job has a name of its own, so a create
    // would not meet it) may not be in the cache yet; the API server says.
    if (!job && earlierAttempts) job = (await d.api.listJobs(d.ns, `${instanceSelector(d.instance)},${LABELS.executionId}=${key}`)).items.find((j) => !j.metadata?.deletionTimestamp);
    if (!job) return null;
  }
  // A pod whose program never reached it (the process that was handing it over died, or was taken
  // over before it could) would wait for a go line until its deadline: it goes, and the run starts
  // again (nothing of it ran). Fencing and deleting it are for the run's holder only: a stale
  // attempt (this process was taken over and does not know yet) that retried would find the new
  // holder's Job of this execution and, its program not handed over yet, remove it.
  await held();
  if ((await d.attached.handedOver(job, executionId)) === false) {
    const name = job.metadata?.name ?? jobName;
    await d.api.deleteJob(d.ns, name, job.metadata?.uid).catch(() => undefined);
    const why = `the program of execution ${executionId} never reached the pod of Job ${name}`;
    if (adopt) throw new RunGoneError(why, true);
    // Its name is the one this attempt creates (a cold Job): go on once it is gone from the API server.
    if (!(await jobGone(d.api, d.ns, name, job.metadata?.uid))) throw new Error(`${why}; it is being removed, retry`);
    d.log.info({ execution_id: executionId, job: name }, 'removed a Job of this execution whose program never reached its pod; starting afresh');
    return null;
  }
  if (!adopt) d.log.warn({ execution_id: executionId, job: job.metadata?.name }, 'a Job of this execution exists (an earlier holder made it); re-attaching to it instead of starting another pod');
  return job;
}
