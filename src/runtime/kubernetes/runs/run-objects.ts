/**
 * The API objects of a cold run (its Job and Secret), created idempotently under the execution's
 * deterministic name, and the garbage collection of run Jobs whose execution is over (SPEC §1.12).
 */
import type { V1Job, V1Secret } from '@kubernetes/client-node';
import type { KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import type { RuntimeHooks } from '../../runtime.ts';
import { ANNOTATIONS, LABELS } from '../names.ts';
import { ownSecret } from './build-job.ts';

/**
 * Creates the run's Job, or takes the one an earlier attempt (or another replica) created under the
 * same deterministic name: 409 is success. A Job made here comes back as it was sent with the uid the
 * server gave it (callers need its name and uid); one taken over comes back as read.
 */
export async function ensureJob(api: KubeApi, ns: string, job: V1Job, jobName: string): Promise<V1Job> {
  for (let waited = false; ; waited = true) {
    const uid = await api.createJobUid(job);
    if (uid) return { ...job, metadata: { ...job.metadata, uid } };
    const existing = await api.getJob(ns, jobName);
    if (!existing) throw new Error(`Job ${jobName} existed and vanished at once; retry`);
    if (!existing.metadata?.deletionTimestamp) return existing;
    // An earlier attempt's Job on its way out (a finalizer holds it): the name is free once it is
    // gone, so wait for that rather than fail the attempt.
    if (waited || !(await jobGone(api, ns, jobName, existing.metadata.uid))) throw new Error(`Job ${jobName} of an earlier attempt is still being deleted; retry`);
  }
}

/** How long {@link jobGone} waits by default, ms. */
export const JOB_GONE_WAIT_MS = 30_000;
/** How often {@link jobGone} asks, ms. */
const JOB_GONE_POLL_MS = 200;

/**
 * Waits until the Job `name` with uid `uid` no longer exists (deleted, or replaced by another of that
 * name); false when it still does after `timeoutMs`. The API server is asked, not an informer cache,
 * which can trail it: a create of the same name right after must not meet the old one.
 */
export async function jobGone(api: KubeApi, ns: string, name: string, uid: string | undefined, timeoutMs = JOB_GONE_WAIT_MS): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const job = await api.getJob(ns, name);
    if (!job || (uid !== undefined && job.metadata?.uid !== uid)) return true;
    if (Date.now() >= end) return false;
    await new Promise((r) => setTimeout(r, JOB_GONE_POLL_MS));
  }
}

/**
 * Creates the run's Secret owned by `owner`. On 409 the Secret there is replaced without being read:
 * it may name a Job of an earlier attempt that was deleted (and would be garbage-collected under the
 * new pod), or be this Job's own (a lost answer, an adoption), which a replacement with the same
 * contents leaves as it was (a pending pod retries its mount). Never reading it lets the chart's
 * runs Role grant `create` and `delete` on Secrets but not `get`: run Secrets have per-run names,
 * which `resourceNames` cannot list, and `get` on every Secret of the namespace is what we avoid.
 */
export async function ensureSecret(api: KubeApi, ns: string, secret: V1Secret, owner: V1Job): Promise<void> {
  const mine = ownSecret(secret, owner);
  if (await api.createSecret(mine)) return;
  const name = mine.metadata?.name ?? '';
  await api.deleteSecret(ns, name);
  if (!(await api.createSecret(mine))) throw new Error(`Secret ${name} was re-created while being replaced; retry`);
}

/**
 * The Secret to re-create for an adopted Job. A Job made by a service of an earlier version (before
 * the runner moved to the sources ConfigMap) mounts the runner from its Secret's key `runner.py`: a
 * re-created Secret without it would leave a pod that has not mounted yet unable to. Pure.
 */
export function secretForJob(secret: V1Secret, job: V1Job, runner: () => string): V1Secret {
  const fromSecret = job.spec?.template.spec?.volumes?.some((v) => v.name === 'runner' && v.secret);
  if (!fromSecret) return secret;
  return { ...secret, data: { ...secret.data, [LEGACY_RUNNER_KEY]: Buffer.from(runner(), 'utf8').toString('base64') } };
}
/** Where an earlier version's Secret held the runner. */
export const LEGACY_RUNNER_KEY = 'runner.py';

/** Deletes the Jobs (of this instance, as listed) whose execution is terminal or unknown (SPEC §1.12). */
export async function collectGarbage(api: KubeApi, ns: string, jobs: readonly V1Job[], hooks: RuntimeHooks, log: Logger): Promise<void> {
  const byId = new Map<string, string>();
  for (const j of jobs) {
    const id = j.metadata?.annotations?.[ANNOTATIONS.executionId] ?? j.metadata?.labels?.[LABELS.executionId];
    if (id && j.metadata?.name) byId.set(id, j.metadata.name);
  }
  if (byId.size === 0) return;
  const live = await hooks.liveExecutionIds([...byId.keys()]);
  for (const [id, name] of byId) {
    if (live.has(id)) continue;
    try {
      await api.deleteJob(ns, name);
      log.info({ execution_id: id, job: name }, 'deleted orphaned run Job');
    } catch (err) {
      log.warn({ execution_id: id, job: name, err: String(err) }, 'could not delete orphaned run Job');
    }
  }
}
