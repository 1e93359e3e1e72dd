/**
 * The cluster warm pool's decisions (issue 10), pure: what each pool Job is as the caches show it
 * (`memberOf`), what to create and remove now (`planPool(wants, members, now)`), and which idle pods a
 * claim tries, in order (`claimOrder`). pool.ts applies them; pool-plan.ts makes the Jobs.
 */
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import { CONTAINERS, LABELS } from '../names.ts';
import { IMAGE_ERRORS, START_ERRORS, toMs } from '../runs/decide.ts';
import { CLAIMED_AT, POOL_LABELS } from './pool-plan.ts';

/** One pool Job as the pool sees it. */
export interface PoolMember {
  name: string;
  jobType: string;
  specHash: string;
  /** Epoch ms the Job was created. */
  createdAt: number;
  /** Its pod's `main` and `collector` run and nothing ends it: it can take a program. */
  ready: boolean;
  /** Claimed by a run (carries an execution id): no longer the pool's. */
  claimed: boolean;
  /** When it was claimed (epoch ms, {@link CLAIMED_AT}); absent when not claimed or the claim's run is known to be over. */
  claimedAt?: number;
  /** Being deleted. */
  deleting: boolean;
  /**
   * Its pod or Job ended without a claim (the runner died, eviction, deadline), or a container cannot
   * start and will not by waiting (image pull or container config errors): useless.
   */
  failed: boolean;
  /** Why it failed, for the log (a container's waiting or terminated reason and message). */
  failedWhy?: string;
}

/** What the pool should hold for one JobType. */
export interface PoolWant {
  jobType: string;
  size: number;
  specHash: string;
}

/** Why an idle pool Job is removed. */
export type RemoveReason = 'jobtype-gone' | 'stale' | 'idle' | 'failed' | 'excess';

/** Container waiting reasons that do not heal by waiting, besides the image errors. */
const STUCK_REASONS = new Set(['CreateContainerConfigError', 'CreateContainerError', 'RunContainerError']);

/** Back-off before a JobType whose pool pods failed `count` times in a row gets new ones: 2 s doubling, at most 5 min. */
export function poolBackoffMs(count: number): number {
  return count <= 0 ? 0 : Math.min(2000 * 2 ** (count - 1), 300_000);
}

/** What to do now. */
export interface PoolPlan {
  create: { jobType: string; count: number }[];
  remove: { name: string; reason: RemoveReason }[];
}

/** Whether main passed its startup probe: `started`, or `ready` where a status has no `started` (a kubelet before 1.16). */
function mainStarted(c: { started?: boolean; ready?: boolean } | undefined): boolean {
  return c?.started ?? c?.ready !== false;
}

/** The pool member view of a Job and its pod (from the caches). */
export function memberOf(job: V1Job, pod: V1Pod | undefined): PoolMember | null {
  const labels = job.metadata?.labels ?? {};
  const jobType = labels[POOL_LABELS.pool];
  if (!jobType || !job.metadata?.name) return null;
  const cs = (n: string) => pod?.status?.containerStatuses?.find((c) => c.name === n);
  const jobEnded = !!job.status?.conditions?.some((c) => (c.type === 'Complete' || c.type === 'Failed') && c.status === 'True');
  const podEnded = pod?.status?.phase === 'Failed' || pod?.status?.phase === 'Succeeded' || !!cs(CONTAINERS.main)?.state?.terminated || !!cs(CONTAINERS.collector)?.state?.terminated;
  const deleting = !!job.metadata.deletionTimestamp || !!pod?.metadata?.deletionTimestamp;
  // A container that cannot start (a bad image, a missing ConfigMap) never will: the pod is failed
  // now rather than holding a pool slot until its idle limit.
  let stuck: string | undefined;
  for (const c of [...(pod?.status?.initContainerStatuses ?? []), ...(pod?.status?.containerStatuses ?? [])]) {
    const w = c.state?.waiting;
    const t = c.state?.terminated;
    if (w?.reason && (IMAGE_ERRORS.has(w.reason) || STUCK_REASONS.has(w.reason))) stuck ??= `${c.name}: ${w.reason}: ${w.message ?? ''}`.trim();
    else if (t?.reason && START_ERRORS.has(t.reason)) stuck ??= `${c.name}: ${t.reason}: ${t.message ?? ''}`.trim();
  }
  const failed = jobEnded || podEnded || stuck !== undefined;
  const claimedAtText = labels[LABELS.executionId] ? job.metadata.annotations?.[CLAIMED_AT] : undefined;
  const claimedAt = claimedAtText && /^\d+$/.test(claimedAtText) ? Number(claimedAtText) : null;
  const mainEnd = cs(CONTAINERS.main)?.state?.terminated;
  const failedWhy = stuck ?? (mainEnd ? `main ended (exit ${mainEnd.exitCode ?? '?'}${mainEnd.reason ? `, ${mainEnd.reason}` : ''})` : `pod ${pod?.status?.phase ?? 'absent'}, Job ${jobEnded ? 'ended' : 'active'}`);
  return {
    name: job.metadata.name,
    jobType,
    specHash: labels[POOL_LABELS.specHash] ?? '',
    createdAt: toMs(job.metadata.creationTimestamp) ?? 0,
    // Ready once main's startup probe reached the runner's ready port (READY_PORT): the kubelet
    // says so in main's `started` at once. Its `ready` follows only at the pod's next sync: Kubernetes
    // 1.20 waited for the periodic one when the probe passed after the containers' last start (seen
    // on kcluster: `started` 6 s after creation, `ready` 63 s later, for a pool pod preloading pandas).
    ready: !!pod && !deleting && !podEnded && stuck === undefined && !!cs(CONTAINERS.main)?.state?.running && mainStarted(cs(CONTAINERS.main)) && !!cs(CONTAINERS.collector)?.state?.running,
    claimed: !!labels[LABELS.executionId],
    ...(claimedAt !== null ? { claimedAt } : {}),
    deleting,
    failed,
    ...(failed ? { failedWhy } : {}),
  };
}

/**
 * The pool's decision. Claimed and deleting members are not the pool's concern. An idle member is
 * removed when its JobType is gone (or wants none), its spec hash differs, it failed, or it waited
 * longer than `maxIdleMs`; beyond the wanted size the newest go (by name within equal ages, so two
 * replicas pick the same ones). Missing members are created, at most `maxStarting` starting per type,
 * and none for a type held (`holdUntil`, the back-off after its pods failed).
 *
 * The refill of a claimed member waits while its run goes on, at most `refillDelayMs` after the claim,
 * as long as the type has a ready member left: a pod starting under gVisor takes CPU for seconds, and
 * on a small node it would slow the very run it replaces (and the next claim is served by the ready
 * one). A type with nothing ready left is refilled at once.
 */
export function planPool(
  wants: readonly PoolWant[],
  members: readonly PoolMember[],
  now: number,
  opts: { maxIdleMs: number; maxStarting: number; holdUntil?: ReadonlyMap<string, number>; refillDelayMs?: number },
): PoolPlan {
  const plan: PoolPlan = { create: [], remove: [] };
  const want = new Map(wants.map((w) => [w.jobType, w]));
  const kept = new Map<string, PoolMember[]>();
  for (const m of members) {
    if (m.claimed || m.deleting) continue;
    const w = want.get(m.jobType);
    let reason: RemoveReason | null = null;
    if (!w || w.size <= 0) reason = 'jobtype-gone';
    else if (m.specHash !== w.specHash) reason = 'stale';
    else if (m.failed) reason = 'failed';
    else if (now - m.createdAt >= opts.maxIdleMs) reason = 'idle';
    if (reason) plan.remove.push({ name: m.name, reason });
    else kept.set(m.jobType, [...(kept.get(m.jobType) ?? []), m]);
  }
  for (const w of wants) {
    if (w.size <= 0) continue;
    const mine = [...(kept.get(w.jobType) ?? [])].sort((a, b) => a.createdAt - b.createdAt || a.name.localeCompare(b.name));
    for (const m of mine.slice(w.size)) plan.remove.push({ name: m.name, reason: 'excess' });
    const live = mine.slice(0, w.size);
    const starting = live.filter((m) => !m.ready).length;
    // After failures, new pods wait out the back-off (a bad image would otherwise churn Jobs).
    if (now < (opts.holdUntil?.get(w.jobType) ?? 0)) continue;
    const busy = live.some((m) => m.ready) ? members.filter((m) => inRun(m, w, now, opts.refillDelayMs ?? 0)).length : 0;
    const count = Math.min(w.size - live.length - busy, Math.max(0, opts.maxStarting - starting));
    if (count > 0) plan.create.push({ jobType: w.jobType, count });
  }
  return plan;
}

/** A claimed member of `w`'s current spec whose run may still go on, claimed less than `delayMs` ago. */
function inRun(m: PoolMember, w: PoolWant, now: number, delayMs: number): boolean {
  return m.claimed && m.claimedAt !== undefined && !m.deleting && !m.failed && m.jobType === w.jobType && m.specHash === w.specHash && now - m.claimedAt < delayMs;
}

/** Claim candidates of a JobType, oldest first (they expire first): ready, idle, current spec. */
export function claimOrder(members: readonly PoolMember[], jobType: string, specHash: string, now: number, maxIdleMs: number): string[] {
  return members
    .filter((m) => m.jobType === jobType && m.ready && !m.claimed && !m.deleting && !m.failed && m.specHash === specHash && now - m.createdAt < maxIdleMs)
    .sort((a, b) => a.createdAt - b.createdAt || a.name.localeCompare(b.name))
    .map((m) => m.name);
}
