/**
 * What becomes of a queued (async) job whose run the machinery failed (issue 22 item 4): a job must
 * not fail for good for a fault it did not cause. A pure decision, table-tested
 * (`test/unit/executions/requeue.test.ts`); `running.ts` applies it.
 *
 * - The breaker refused the run before the engine was called: back to the queue, not claimed again
 *   before the breaker's recovery time; this costs the job nothing (no infrastructure failure counted).
 * - The engine failed (thrown after the guard's retries, or a run that reports the machinery failed)
 *   before user code started: back to the queue after a backoff (1 s, 2 s, 4 s, … capped at 30 s),
 *   at most {@link MAX_INFRA_REQUEUES} times; past that it fails as before (`internal_error`, DLQ), marked
 *   `failed_before_start` so that its idempotency key may be submitted again.
 * - User code had started: never run again (it may have had effects); settled as the run ended.
 * - Sync runs are never requeued (a caller is waiting on the socket).
 */

/** How many times one job goes back to the queue for infrastructure failures before it fails. */
export const MAX_INFRA_REQUEUES = 5;
/** Backoff before the first re-claim after an infrastructure failure, doubled each time. */
export const INFRA_BACKOFF_BASE_MS = 1000;
/** Cap on one backoff. */
export const INFRA_BACKOFF_MAX_MS = 30_000;

/** What the run came to, as far as the decision is concerned. */
export interface FaultFacts {
  mode: 'sync' | 'async' | string;
  /**
   * `rejected`: the breaker refused the run; `engine`: the machinery failed (a throw, or a run that
   * says so); `other`: anything else (user code's own result, a cancel, a config error).
   */
  kind: 'rejected' | 'engine' | 'other';
  /** How many times the engine was called for this run (0: refused before any call). */
  engineCalls: number;
  /** Whether user code began (the runtime reported the execution phase). */
  userCodeStarted: boolean;
  /** Infrastructure failures of this job so far (its record's `infra_failures`). */
  infraFailures: number;
  /** When the breaker lets runs through again (0 when it is not open). */
  breakerRetryInMs: number;
}

/** The decision: settle the record as the run ended, or give it back to the queue. */
export type AfterFault = { action: 'settle'; failedBeforeStart: boolean } | { action: 'requeue'; delayMs: number; infraFailures: number };

/** Decides what becomes of a run the machinery may have failed (see the module comment). */
export function afterFault(f: FaultFacts, maxRequeues = MAX_INFRA_REQUEUES): AfterFault {
  const infra = f.kind !== 'other';
  const beforeStart = infra && !f.userCodeStarted;
  if (f.mode !== 'async' || !beforeStart) return { action: 'settle', failedBeforeStart: beforeStart };
  if (f.kind === 'rejected' && f.engineCalls === 0) return { action: 'requeue', delayMs: Math.max(INFRA_BACKOFF_BASE_MS, f.breakerRetryInMs), infraFailures: f.infraFailures };
  const n = f.infraFailures + 1;
  if (n > maxRequeues) return { action: 'settle', failedBeforeStart: true };
  return { action: 'requeue', delayMs: Math.max(f.breakerRetryInMs, Math.min(INFRA_BACKOFF_MAX_MS, INFRA_BACKOFF_BASE_MS * 2 ** (n - 1))), infraFailures: n };
}
