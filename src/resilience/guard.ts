/**
 * The one guard policy (SPEC §3, §7.3 rules 5 and 6), applied around each run attempt for every
 * runtime by `executions/running.ts` and nowhere else:
 *
 * - an open circuit rejects the run at once (`service_unavailable`), without calling the engine;
 * - every attempt counts exactly once: a throw is one breaker failure, a resolved run that says the
 *   machinery failed (the caller's `isEngineFailure`) is one failure, any other resolved run — user
 *   code failing included — is one success of the engine;
 * - a thrown, retryable failure is tried again, at most `attempts` in all, after an exponential
 *   backoff with jitter (`retry.ts`'s {@link backoffDelay}).
 *
 * Written here rather than composed from `withRetry` + `CircuitBreaker.exec` because the policy is
 * the point: which outcome counts how, and when the breaker is asked, read top to bottom in one loop.
 */
import { UnretryableError } from '../errors.ts';
import { BreakerOpenError, type CircuitBreaker } from './breaker.ts';
import { backoffDelay } from './retry.ts';

/** Retry numbers of SPEC §8 (`retry`): total attempts and the first backoff. */
export interface GuardPolicy {
  /** Total attempts, the first included (SPEC: 2). */
  attempts: number;
  /** Delay before the second attempt, before jitter (SPEC: 1 s). */
  baseDelayMs: number;
  /** Cap on one backoff. */
  maxDelayMs?: number;
}

/** Options of {@link RunGuard}. */
export interface RunGuardOptions {
  breaker: CircuitBreaker;
  policy: GuardPolicy;
  /** Waits between attempts (tests pass an instant or recording one). */
  sleep?: (ms: number) => Promise<void>;
  /** Jitter source in [0, 1). */
  random?: () => number;
}

/** How one guarded call judges its outcomes. */
export interface GuardCall<T> {
  /** A resolved value that still means the engine failed: counts against the breaker, not retried. */
  isEngineFailure?: (value: T) => boolean;
  /**
   * A thrown error that says nothing about the engine's health (e.g. "nothing to re-attach to"):
   * neither counted nor retried, returned as `failed`.
   */
  isNeutral?: (err: unknown) => boolean;
  /** Whether a counted failure may be tried again (also never after an {@link UnretryableError}). */
  retryable?: (err: unknown) => boolean;
  onRetry?: (attempt: number, err: unknown, delayMs: number) => void;
}

/** What a guarded call ended with; `attempts` is how many times the engine was called. */
export type Guarded<T> =
  | { kind: 'ok'; value: T; attempts: number }
  /**
   * The circuit was open before an attempt (the first, or a retry): the engine was not called for it.
   * `lastFailure`: what the previous attempt threw, when there was one.
   */
  | { kind: 'rejected'; error: BreakerOpenError; attempts: number; lastFailure?: unknown }
  /** The last attempt threw (retries exhausted, not retryable, or neutral). */
  | { kind: 'failed'; error: unknown; attempts: number };

/** The guard around run attempts: one breaker, one retry policy, for every runtime. */
export class RunGuard {
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly random: () => number;

  constructor(private readonly o: RunGuardOptions) {
    this.sleep = o.sleep ?? ((ms) => new Promise<void>((r) => setTimeout(r, ms)));
    this.random = o.random ?? Math.random;
  }

  /** The breaker this guard counts against (for `/health`). */
  get breaker(): CircuitBreaker {
    return this.o.breaker;
  }

  /** Calls `fn` (given the 1-based attempt number) under the policy; never throws what `fn` throws. */
  async run<T>(fn: (attempt: number) => Promise<T>, call: GuardCall<T> = {}): Promise<Guarded<T>> {
    const { breaker, policy } = this.o;
    const max = Math.max(1, policy.attempts);
    // A function, not a read of the getter: the state changes under the awaits below.
    const isOpen = () => breaker.state === 'open';
    for (let n = 1; ; n++) {
      if (isOpen()) return { kind: 'rejected', error: openError(breaker), attempts: n - 1 };
      let value: T;
      try {
        value = await fn(n);
      } catch (err) {
        // An engine call that was itself refused by the breaker is the same answer, not a new failure.
        if (err instanceof BreakerOpenError) return { kind: 'rejected', error: err, attempts: n };
        if (call.isNeutral?.(err)) return { kind: 'failed', error: err, attempts: n };
        breaker.recordFailure();
        const again = n < max && !(err instanceof UnretryableError) && (call.retryable?.(err) ?? true);
        if (!again) return { kind: 'failed', error: err, attempts: n };
        // This failure opened the circuit: the retry would be refused, so do not wait for it.
        if (isOpen()) return { kind: 'rejected', error: openError(breaker), attempts: n, lastFailure: err };
        const delay = backoffDelay(n, policy.baseDelayMs, policy.maxDelayMs ?? 30_000, this.random);
        call.onRetry?.(n, err, delay);
        await this.sleep(delay);
        continue;
      }
      if (call.isEngineFailure?.(value)) breaker.recordFailure();
      else breaker.recordSuccess();
      return { kind: 'ok', value, attempts: n };
    }
  }
}

/** The breaker's own refusal (its message says when to retry). */
function openError(breaker: CircuitBreaker): BreakerOpenError {
  try {
    breaker.check();
  } catch (err) {
    if (err instanceof BreakerOpenError) return err;
    throw err;
  }
  return new BreakerOpenError(0);
}
