/**
 * The Kubernetes session pool's decisions (issue 19), pure: what a pooled session Job is as the caches
 * show it (`sessionPoolMemberOf`), what the leader creates and removes now (`planSessionPools`), and
 * which ready pods a claim tries, in order (`sessionClaimOrder`). The sizing itself (targets with the
 * demand floor, surplus retired only after waiting `idleMs`) is the one both runtimes use
 * (runtime/session-pool-sizing.ts); session-pool.ts applies the plan, session-pool-plan.ts makes the Jobs.
 */
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import { planSessionPool } from '../../session-pool-sizing.ts';
import { CONTAINERS } from '../names.ts';
import { toMs } from '../runs/decide.ts';
import { podEnd, podTrouble } from './session-decide.ts';
import { SESSION_LABELS } from './session-job.ts';
import { SESSION_CLAIMED_AT, SESSION_POOL_LABELS } from './session-pool-plan.ts';
import type { PoolMember } from '../pool/pool-decide.ts';

/** One pooled session Job as the pool sees it: what a run pool member is (ready: its collector and `main` run; claimed: it carries a session id). */
export type SessionPoolMember = PoolMember;

/** What the pool should hold of one job type now. */
export interface SessionPoolWant {
  jobType: string;
  target: number;
  specHash: string;
}

/** Why an unclaimed pooled Job is removed. */
export type SessionPoolRemoveReason = 'jobtype-gone' | 'stale' | 'failed' | 'surplus';

/** What to do now. */
export interface SessionPoolDecision {
  create: { jobType: string; count: number }[];
  remove: { name: string; reason: SessionPoolRemoveReason }[];
}

/** The pool's view of a Job and its pod; null for a Job that is no pooled session Job. */
export function sessionPoolMemberOf(job: V1Job, pod: V1Pod | undefined): SessionPoolMember | null {
  const labels = job.metadata?.labels ?? {};
  const jobType = labels[SESSION_POOL_LABELS.pool];
  if (!jobType || !job.metadata?.name) return null;
  const jobEnded = !!job.status?.conditions?.some((c) => (c.type === 'Complete' || c.type === 'Failed') && c.status === 'True');
  const state = podEnd(pod);
  const deleting = !!job.metadata.deletionTimestamp || state === 'gone';
  const failed = jobEnded || state === 'ended';
  const main = pod?.status?.containerStatuses?.find((c) => c.name === CONTAINERS.main);
  const claimed = !!labels[SESSION_LABELS.sessionId];
  const claimedText = claimed ? job.metadata.annotations?.[SESSION_CLAIMED_AT] : undefined;
  return {
    name: job.metadata.name,
    jobType,
    specHash: labels[SESSION_POOL_LABELS.specHash] ?? '',
    createdAt: toMs(job.metadata.creationTimestamp) ?? 0,
    ready: !deleting && !failed && state === 'attachable' && !!main?.state?.running,
    claimed,
    ...(claimedText && /^\d+$/.test(claimedText) ? { claimedAt: Number(claimedText) } : {}),
    deleting,
    failed,
    ...(failed ? { failedWhy: jobEnded && state !== 'ended' ? 'its Job ended' : podTrouble(pod) } : {}),
  };
}

/**
 * The leader's decision. Claimed and deleting members are not the pool's concern. An unclaimed member
 * is removed when its job type is gone (or is not pooled), its spec hash is not the type's now, or it
 * failed; of the rest, each type's surplus over its target is retired once it has waited `idleMs`
 * (oldest first), and missing ones are created, at most `maxStarting` starting in all (session pods
 * start an interpreter under gVisor: a burst of them would starve the runs on a small node), none for a
 * type held (`holdUntil`, the back-off after its pods failed). Types in name order, so the budget goes
 * the same way on every pass.
 */
export function planSessionPools(
  wants: readonly SessionPoolWant[],
  members: readonly SessionPoolMember[],
  now: number,
  opts: { idleMs: number; maxStarting: number; holdUntil?: ReadonlyMap<string, number> },
): SessionPoolDecision {
  const out: SessionPoolDecision = { create: [], remove: [] };
  const want = new Map(wants.map((w) => [w.jobType, w]));
  const kept = new Map<string, SessionPoolMember[]>();
  for (const m of members) {
    if (m.claimed || m.deleting) continue;
    const w = want.get(m.jobType);
    const reason: SessionPoolRemoveReason | null = !w ? 'jobtype-gone' : m.specHash !== w.specHash ? 'stale' : m.failed ? 'failed' : null;
    if (reason) out.remove.push({ name: m.name, reason });
    else kept.set(m.jobType, [...(kept.get(m.jobType) ?? []), m]);
  }
  let budget = opts.maxStarting - [...kept.values()].flat().filter((m) => !m.ready).length;
  for (const w of [...wants].sort((a, b) => a.jobType.localeCompare(b.jobType))) {
    const mine = kept.get(w.jobType) ?? [];
    const ready = mine.filter((m) => m.ready).sort((a, b) => a.createdAt - b.createdAt || a.name.localeCompare(b.name));
    const held = now < (opts.holdUntil?.get(w.jobType) ?? 0);
    const p = planSessionPool(now, { target: w.target, ready: ready.map((m) => m.createdAt), starting: mine.length - ready.length }, opts.idleMs, held ? 0 : Math.max(0, budget));
    for (const i of p.retire) out.remove.push({ name: ready[i]!.name, reason: 'surplus' });
    if (p.start > 0) {
      out.create.push({ jobType: w.jobType, count: p.start });
      budget -= p.start;
    }
  }
  return out;
}

/** Claim candidates of a job type, oldest first: ready, unclaimed, of the type's spec now. */
export function sessionClaimOrder(members: readonly SessionPoolMember[], jobType: string, specHash: string): string[] {
  return members
    .filter((m) => m.jobType === jobType && m.ready && !m.claimed && !m.deleting && !m.failed && m.specHash === specHash)
    .sort((a, b) => a.createdAt - b.createdAt || a.name.localeCompare(b.name))
    .map((m) => m.name);
}

/**
 * When a session of each job type was last opened, as the cluster shows it: the claim time of claimed
 * pooled Jobs, the creation of cold session Jobs (live sessions only: an ended session's Job is gone;
 * each replica adds the opens it saw itself). Feeds the demand floor of the sizing.
 */
export function lastOpenedByType(jobs: readonly V1Job[], jobTypeLabel: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const j of jobs) {
    const labels = j.metadata?.labels ?? {};
    const type = labels[jobTypeLabel];
    if (!type || !labels[SESSION_LABELS.sessionId]) continue;
    const claimed = j.metadata?.annotations?.[SESSION_CLAIMED_AT];
    const at = claimed && /^\d+$/.test(claimed) ? Number(claimed) : (toMs(j.metadata?.creationTimestamp) ?? 0);
    if (at > (out.get(type) ?? 0)) out.set(type, at);
  }
  return out;
}
