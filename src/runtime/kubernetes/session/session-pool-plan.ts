/**
 * The Jobs of the Kubernetes session pool (issue 19: "a sandbox, from the warm pool when one is ready,
 * becomes this session's"), pure: a pooled session Job and what a claim writes on it and its pod.
 *
 * A pooled session Job is a session Job (session-job.ts, the one builder of what a session's pod is:
 * the run Job's security, limits, network labels, read-only /code and /input, rw /workspace) made for
 * no session yet: its name is random (`sps-p-…`), not derived from a session id, and it carries no
 * session-id label, so nothing that looks for a session's pod (adoption, the leader's sweep of ended
 * sessions) ever takes it for one. What is per session is bound at the claim, never baked in:
 * - the session-id label, on the Job (the claim itself, with the resourceVersion the Job was read at
 *   as precondition: a second claimer gets 409) and then on its pod (adoption finds pods by it);
 * - the deadline: `activeDeadlineSeconds` (mutable on a Job, counted from its start) becomes the Job's
 *   age plus the session's lifetime plus the slack a cold session Job gets.
 * A claimed Job keeps its pool label (so its name's origin stays visible) and never returns to the
 * pool: it is the session's, and is deleted with it.
 *
 * Types whose egress goes through the egress proxy (`allowed_hosts` with `kubernetes.egress_proxy`)
 * are not pooled: their session's proxy credential is signed for the session id and is in the pod's
 * command from its start, and the session channel has no clean way to hand it to the interpreter and
 * to every process it starts later (they start their own sandbox; docs/sessions.md).
 */
import { createHash } from 'node:crypto';
import type { V1Job } from '@kubernetes/client-node';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { BuildJobConfig } from '../runs/build-job.ts';
import { toMs } from '../runs/decide.ts';
import { SESSION_DEADLINE_SLACK_SEC, SESSION_LABELS, sessionJob } from './session-job.ts';

/** Labels only pooled session Jobs (and their pods) carry. */
export const SESSION_POOL_LABELS = {
  /** The job type the pod waits for a session of. */
  pool: 'sandpod.io/session-pool',
  /** Hash of the pod template: a job type, runner or config change makes unclaimed pods stale. */
  specHash: 'sandpod.io/session-pool-spec',
} as const;

/** Annotation a claim puts on a pooled session Job: when it was claimed (epoch ms). */
export const SESSION_CLAIMED_AT = 'sandpod.io/session-claimed-at';

/**
 * The deadline of an unclaimed pooled session Job, s: a backstop only (the leader removes surplus and
 * stale ones; up to the target they stay however long they wait), past which the Job controller ends
 * it and the pool starts a fresh one.
 */
export const SESSION_POOL_DEADLINE_SEC = 86_400;

/** Inputs of {@link sessionPoolJob}. */
export interface SessionPoolJobOptions {
  /** The Job's name (random, `sps-p-…`). */
  name: string;
  runtimeClassName: string | null;
  /** The runner sources ConfigMap's name (runs/runner-sources.ts). */
  sources: string;
}

function body(jobType: JobType, config: BuildJobConfig, o: SessionPoolJobOptions): V1Job {
  const job = sessionJob(jobType, config, {
    sessionId: null,
    name: o.name,
    runtimeClassName: o.runtimeClassName,
    sources: o.sources,
    // Only sessions asking for the type's own requirements take a pooled pod (sessions.ts).
    requirements: jobType.requirements,
    lifetimeSec: SESSION_POOL_DEADLINE_SEC - SESSION_DEADLINE_SLACK_SEC,
    egressProxy: null,
  });
  job.metadata!.labels![SESSION_POOL_LABELS.pool] = jobType.name;
  job.spec!.template.metadata!.labels![SESSION_POOL_LABELS.pool] = jobType.name;
  return job;
}

/** The pooled session Job of a job type, labelled with its spec hash (the template's, names left out). Pure. */
export function sessionPoolJob(jobType: JobType, config: BuildJobConfig, o: SessionPoolJobOptions): { job: V1Job; specHash: string } {
  const job = body(jobType, config, o);
  const specHash = createHash('sha256').update(JSON.stringify(job.spec?.template ?? {})).digest('hex').slice(0, 16);
  job.metadata!.labels![SESSION_POOL_LABELS.specHash] = specHash;
  job.spec!.template.metadata!.labels![SESSION_POOL_LABELS.specHash] = specHash;
  return { job, specHash };
}

/** An RFC 6901 path segment. */
const pointer = (key: string) => key.replace(/~/g, '~0').replace(/\//g, '~1');

/**
 * The claim of a pooled session Job, as a JSON patch: the session-id label, the claim's time, and the
 * session's deadline counted from now. Its `metadata.resourceVersion` is the version the Job was read
 * at, which the API server takes as a precondition (409 when another claim, or a removal, came first).
 */
export function sessionClaimJobPatch(job: V1Job, sessionId: string, lifetimeSec: number, now: number): object[] {
  const started = toMs(job.status?.startTime) ?? toMs(job.metadata?.creationTimestamp) ?? now;
  const ageSec = Math.max(0, Math.ceil((now - started) / 1000));
  return [
    { op: 'replace', path: '/metadata/resourceVersion', value: job.metadata?.resourceVersion ?? '' },
    { op: 'add', path: `/metadata/labels/${pointer(SESSION_LABELS.sessionId)}`, value: sessionId },
    { op: 'add', path: `/metadata/annotations/${pointer(SESSION_CLAIMED_AT)}`, value: String(now) },
    { op: 'replace', path: '/spec/activeDeadlineSeconds', value: ageSec + lifetimeSec + SESSION_DEADLINE_SLACK_SEC },
  ];
}

/**
 * The claimed pod's label, as a JSON patch at the pod's read version (a precondition too): the pod of
 * a Job this claim won is written by nobody else, so a 409 means only that its status moved on.
 */
export function sessionClaimPodPatch(resourceVersion: string, sessionId: string): object[] {
  return [
    { op: 'replace', path: '/metadata/resourceVersion', value: resourceVersion },
    { op: 'add', path: `/metadata/labels/${pointer(SESSION_LABELS.sessionId)}`, value: sessionId },
  ];
}
