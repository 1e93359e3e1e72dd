/**
 * Retry with exponential backoff and full jitter (SPEC §7.3 rule 6: at most 2 attempts, base 1 s).
 * Only transient failures are retried: an {@link UnretryableError} or a {@link BreakerOpenError}
 * stops at once.
 */
import { UnretryableError } from '../errors.ts';
import { BreakerOpenError } from './breaker.ts';

/** Options; defaults are SPEC §8's. */
export interface RetryOptions {
  /** Total attempts, the first included. */
  attempts?: number;
  baseDelayMs?: number;
  maxDelayMs?: number;
  random?: () => number;
  sleep?: (ms: number) => Promise<void>;
  /** Whether an error is worth another attempt (default: all but unretryable/breaker-open). */
  retryable?: (err: unknown) => boolean;
  onRetry?: (attempt: number, err: unknown, delayMs: number) => void;
}

/** Error carrying how many attempts were made. */
export class RetriesExhaustedError extends Error {
  override readonly name = 'RetriesExhaustedError';
  constructor(readonly attempts: number, readonly lastError: unknown) {
    super(lastError instanceof Error ? lastError.message : String(lastError));
  }
}

/** Delay before attempt `n + 1` (n ≥ 1): base · 2^(n−1), scaled by a jitter in [0.5, 1). */
export function backoffDelay(n: number, baseMs: number, maxMs: number, random: () => number): number {
  const exp = Math.min(maxMs, baseMs * 2 ** (n - 1));
  return Math.round(exp * (0.5 + random() * 0.5));
}

const defaultRetryable = (err: unknown) => !(err instanceof UnretryableError) && !(err instanceof BreakerOpenError);

/** Runs `fn` until it resolves or attempts run out; throws {@link RetriesExhaustedError} then. */
export async function withRetry<T>(fn: (attempt: number) => Promise<T>, opts: RetryOptions = {}): Promise<T> {
  const attempts = opts.attempts ?? 2;
  const base = opts.baseDelayMs ?? 1000;
  const max = opts.maxDelayMs ?? 30_000;
  const random = opts.random ?? Math.random;
  const sleep = opts.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const retryable = opts.retryable ?? defaultRetryable;
  for (let n = 1; ; n++) {
    try {
      return await fn(n);
    } catch (err) {
      if (!retryable(err)) throw err;
      if (n >= attempts) throw new RetriesExhaustedError(n, err);
      const delay = backoffDelay(n, base, max, random);
      opts.onRetry?.(n, err, delay);
      await sleep(delay);
    }
  }
}
