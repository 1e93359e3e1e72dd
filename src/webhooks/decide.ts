/**
 * What follows one delivery attempt: a pure decision over the attempt's result, the delivery's history
 * and the time, table-tested (test/unit/webhooks/decide.test.ts) like the controller's `decide`.
 *
 * - A 2xx answer delivers.
 * - 410 Gone, or a destination the SSRF rules refuse, ends the delivery at once: trying again cannot
 *   change either (the receiver said the endpoint is gone; the operator's rules said no).
 * - Anything else (no answer, a timeout, 3xx since redirects are not followed, 4xx, 5xx) is tried again
 *   after an exponential backoff with jitter: `base · 2^(n-1)`, drawn between half and all of it, so
 *   receivers that came back together are not hit together. With the defaults (30 s base, 8
 *   attempts, 1 h) the attempts span 27 to 53 min, inside the hour.
 * - The delivery fails for good after `maxAttempts` attempts, or when the next attempt would start
 *   more than `maxAgeMs` after the first one.
 */

/** What one attempt came to. */
export type AttemptResult =
  | { kind: 'answered'; statusCode: number }
  | { kind: 'error'; message: string }
  /** The URL or its resolved address is not allowed (ssrf.ts): never retried. */
  | { kind: 'refused'; message: string };

/** The delivery's retry policy. */
export interface RetryPolicy {
  maxAttempts: number;
  maxAgeMs: number;
  baseDelayMs: number;
}

/** Facts the decision is made from. */
export interface AttemptFacts {
  result: AttemptResult;
  /** Number of this attempt, from 1. */
  attempt: number;
  /** When the first attempt started (ms since the epoch). */
  firstAttemptAt: number;
  now: number;
  policy: RetryPolicy;
  /** A number in [0, 1) (Math.random in production, fixed in tests). */
  random: number;
}

/** The decision: `retried` carries when the next attempt is due. */
export type AttemptDecision =
  | { outcome: 'delivered' }
  | { outcome: 'retried'; nextAttemptAt: number; delayMs: number }
  | { outcome: 'failed'; reason: string };

/** The backoff before attempt `next` (from 2), with jitter: between half and all of `base · 2^(next-2)`. */
export function backoffMs(next: number, baseDelayMs: number, random: number): number {
  const full = baseDelayMs * 2 ** Math.max(0, next - 2);
  return Math.round(full / 2 + (full / 2) * Math.min(Math.max(random, 0), 1));
}

/** One line describing an attempt's result (the error column and logs). */
export function describeResult(r: AttemptResult): string {
  return r.kind === 'answered' ? `HTTP ${r.statusCode}` : r.message;
}

/** Decides what follows an attempt (see the module comment). */
export function decideAfterAttempt(f: AttemptFacts): AttemptDecision {
  const { result, policy } = f;
  if (result.kind === 'answered' && result.statusCode >= 200 && result.statusCode < 300) return { outcome: 'delivered' };
  if (result.kind === 'refused') return { outcome: 'failed', reason: `destination refused: ${result.message}` };
  if (result.kind === 'answered' && result.statusCode === 410) return { outcome: 'failed', reason: 'the receiver answered 410 Gone' };
  const last = `last attempt: ${describeResult(result)}`;
  if (f.attempt >= policy.maxAttempts) return { outcome: 'failed', reason: `gave up after ${f.attempt} attempt(s) (max_attempts); ${last}` };
  const delayMs = backoffMs(f.attempt + 1, policy.baseDelayMs, f.random);
  const nextAttemptAt = f.now + delayMs;
  if (nextAttemptAt - f.firstAttemptAt > policy.maxAgeMs) {
    return { outcome: 'failed', reason: `gave up after ${f.attempt} attempt(s): the next one would start after max_age_seconds; ${last}` };
  }
  return { outcome: 'retried', nextAttemptAt, delayMs };
}
