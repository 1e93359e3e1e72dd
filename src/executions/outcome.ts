/**
 * What a run's outcome counts as: an engine failure for the breaker, a DLQ entry, the verdict of a
 * run the machinery failed before the program could say anything.
 */
import type { RawRun } from '../runtime/runtime.ts';
import type { Classification } from './classify.ts';
import type { ExecutionRow } from '../store/database.ts';

/** Error types whose runs are put in the dead letter queue (SPEC §7.3 rule 7). */
export const DLQ_ERROR_TYPES = new Set(['internal_error', 'service_unavailable', 'docker_error', 'config_error']);

/** A resolved run counts against the breaker when the machinery (not the user's code) failed. */
export function isEngineFailure(raw: RawRun): boolean {
  const t = raw.observation.infraError?.type;
  return t === 'internal_error' || t === 'docker_error';
}

export function internalClassification(type: string, message: string): Classification {
  return {
    status: 'failed',
    exitCode: null,
    error: { type, message },
    output: null,
    timing: { startup_ms: 0, dep_install_ms: 0, execution_ms: 0, total_ms: 0, phase_at_exit: 'startup' },
    resourceUsage: { max_rss_mb: 0, cpu_time_ms: 0, wall_time_ms: 0 },
  };
}

/** Beyond a taken-over sync run's own time limits, how long its caller waits for the new holder's verdict, ms. */
export const TAKEN_OVER_GRACE_MS = 60_000;

/**
 * A sync run this process was running was taken over by another process (this one was presumed dead:
 * its holder lease lapsed while it was starved or cut off; queue/holders.ts). That process settles
 * the record: the API answers the caller with its verdict once written, within `waitMs`.
 */
export class TakenOverError extends Error {
  override readonly name = 'TakenOverError';
  constructor(
    readonly executionId: string,
    readonly waitMs: number,
  ) {
    super(`execution ${executionId} was taken over by another process, which settles it`);
  }
}

/** Observers for metrics; all optional. */
export interface ExecutionEvents {
  onFinished?(row: ExecutionRow): void;
  onStarted?(row: ExecutionRow): void;
  /** A held job went back to the queue. */
  onRequeued?(row: ExecutionRow, reason: RequeueReason): void;
}

/** Why a held job went back to the queue (the `reason` label of `sandpod_requeues_total`). */
export type RequeueReason = 'breaker_open' | 'infra_failure' | 'shutdown' | 'crash';
