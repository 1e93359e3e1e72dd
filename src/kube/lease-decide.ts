/**
 * Leader election over a `coordination.k8s.io/v1` Lease, as a pure decision: given what this replica
 * last saw of the Lease (and when it saw it change), what to do now. The loop that reads and writes
 * the Lease is leader-elector.ts.
 *
 * Our own, not a library: @kubernetes/client-node 1.4.0 has no leader election (client-go's
 * `leaderelection` package is Go). The rules follow client-go's so that the Lease reads the same in
 * `kubectl get lease` and behaves as operators expect:
 * - expiry is judged by this replica's clock from the moment it *observed* the record change, never by
 *   comparing the holder's `renewTime` with our clock, so clock skew between nodes cannot make two
 *   leaders;
 * - a holder that cannot renew within `renewDeadlineMs` (< `leaseDurationMs`) steps down on its own
 *   before anyone else may take the Lease;
 * - a Lease released on shutdown (empty holder) is taken at once;
 * - every write carries the `resourceVersion` read, so of two replicas racing only one succeeds.
 */

/** What the Lease says, as the elector uses it (times in ms since the epoch). */
export interface LeaseRecord {
  holder: string;
  leaseDurationSec: number;
  acquireMs: number;
  renewMs: number;
  transitions: number;
  /** The object's resourceVersion: writes are conditional on it. Empty for a record not yet stored. */
  resourceVersion: string;
}

export interface ElectionTiming {
  /** How long a non-holder waits, from its last observed change, before it may take the Lease. */
  leaseDurationMs: number;
  /** How long the holder keeps leading without a successful renew. Must be < leaseDurationMs. */
  renewDeadlineMs: number;
  /** Pause between attempts (acquire or renew). Must be < renewDeadlineMs. */
  retryPeriodMs: number;
}

/** client-go's defaults (15 s / 10 s / 2 s). */
export const DEFAULT_TIMING: ElectionTiming = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000, retryPeriodMs: 2_000 };

/** Throws on timing that could let two replicas lead at once. */
export function checkTiming(t: ElectionTiming): void {
  if (!(t.retryPeriodMs > 0 && t.retryPeriodMs < t.renewDeadlineMs && t.renewDeadlineMs < t.leaseDurationMs)) {
    throw new Error(`leader election: need 0 < retry period (${t.retryPeriodMs} ms) < renew deadline (${t.renewDeadlineMs} ms) < lease duration (${t.leaseDurationMs} ms)`);
  }
}

/** The Lease as last read, and when this replica saw its holder or renew time change. */
export interface Observed {
  record: LeaseRecord;
  changedAtMs: number;
}

export type LeaseStep =
  /** No Lease yet: create it holding it. */
  | { kind: 'create'; record: LeaseRecord }
  /** We hold it: write a new renew time. */
  | { kind: 'renew'; record: LeaseRecord }
  /** Released, or not renewed for a whole lease duration as we observed it: take it. */
  | { kind: 'take'; record: LeaseRecord }
  /** Someone else holds a live Lease: wait; it may be taken from `expiresAtMs` on. */
  | { kind: 'follow'; holder: string; expiresAtMs: number };

/** One decision. `current` is the Lease as just read (null: absent); `observed` what we saw before. */
export function decideLease(nowMs: number, me: string, current: LeaseRecord | null, observed: Observed | null, t: ElectionTiming): LeaseStep {
  const durationSec = Math.ceil(t.leaseDurationMs / 1000);
  if (current === null) {
    return { kind: 'create', record: { holder: me, leaseDurationSec: durationSec, acquireMs: nowMs, renewMs: nowMs, transitions: 0, resourceVersion: '' } };
  }
  if (current.holder === me) {
    return { kind: 'renew', record: { ...current, leaseDurationSec: durationSec, renewMs: nowMs } };
  }
  const take = (): LeaseStep => ({
    kind: 'take',
    record: { holder: me, leaseDurationSec: durationSec, acquireMs: nowMs, renewMs: nowMs, transitions: current.transitions + 1, resourceVersion: current.resourceVersion },
  });
  if (current.holder === '') return take();
  const since = changedSince(nowMs, current, observed);
  // The holder's own duration counts when longer than ours (a replica configured differently).
  const waitMs = Math.max(t.leaseDurationMs, current.leaseDurationSec * 1000);
  const expiresAtMs = since + waitMs;
  return nowMs >= expiresAtMs ? take() : { kind: 'follow', holder: current.holder, expiresAtMs };
}

/** When the record last changed as this replica saw it: now, if it differs from what we saw before. */
export function changedSince(nowMs: number, current: LeaseRecord, observed: Observed | null): number {
  if (observed && observed.record.holder === current.holder && observed.record.renewMs === current.renewMs && observed.record.resourceVersion === current.resourceVersion) {
    return observed.changedAtMs;
  }
  return nowMs;
}

/** The record to write on a clean shutdown: no holder, so a waiting replica takes it at once. */
export function releasedRecord(current: LeaseRecord, nowMs: number): LeaseRecord {
  return { ...current, holder: '', leaseDurationSec: 1, renewMs: nowMs };
}

/** Whether a leader whose last successful renew was at `lastRenewMs` must step down now. */
export function mustStepDown(nowMs: number, lastRenewMs: number, t: ElectionTiming): boolean {
  return nowMs - lastRenewMs >= t.renewDeadlineMs;
}
