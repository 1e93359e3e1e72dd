import { describe, expect, it } from 'vitest';
import { backoffMs, decideAfterAttempt, type AttemptFacts, type AttemptResult } from '../../../src/webhooks/decide.ts';

const T0 = Date.parse('2026-01-01T00:00:00Z');
const policy = { maxAttempts: 8, maxAgeMs: 3600_000, baseDelayMs: 25_000 };
const facts = (result: AttemptResult, o: Partial<AttemptFacts> = {}): AttemptFacts => ({ result, attempt: 1, firstAttemptAt: T0, now: T0, policy, random: 0.5, ...o });
const status = (statusCode: number): AttemptResult => ({ kind: 'answered', statusCode });

describe('decideAfterAttempt', () => {
  it.each([
    ['200 delivers', facts(status(200)), { outcome: 'delivered' }],
    ['204 delivers', facts(status(204)), { outcome: 'delivered' }],
    ['299 delivers', facts(status(299)), { outcome: 'delivered' }],
    ['302 is not followed: retried', facts(status(302)), { outcome: 'retried', delayMs: 18_750, nextAttemptAt: T0 + 18_750 }],
    ['500 retried', facts(status(500)), { outcome: 'retried', delayMs: 18_750, nextAttemptAt: T0 + 18_750 }],
    ['429 retried', facts(status(429)), { outcome: 'retried' }],
    ['404 retried', facts(status(404)), { outcome: 'retried' }],
    ['a connection error is retried', facts({ kind: 'error', message: 'ECONNREFUSED' }), { outcome: 'retried' }],
    ['410 Gone ends it', facts(status(410)), { outcome: 'failed', reason: 'the receiver answered 410 Gone' }],
    ['a refused destination ends it at once', facts({ kind: 'refused', message: 'x resolves to 127.0.0.1' }), { outcome: 'failed', reason: 'destination refused: x resolves to 127.0.0.1' }],
    ['the last attempt fails', facts(status(503), { attempt: 8 }), { outcome: 'failed', reason: 'gave up after 8 attempt(s) (max_attempts); last attempt: HTTP 503' }],
    ['a success on the last attempt delivers', facts(status(200), { attempt: 8 }), { outcome: 'delivered' }],
    [
      'past max age fails',
      facts({ kind: 'error', message: 'timeout' }, { attempt: 3, now: T0 + 3590_000 }),
      { outcome: 'failed', reason: 'gave up after 3 attempt(s): the next one would start after max_age_seconds; last attempt: timeout' },
    ],
  ] as const)('%s', (_name, f, want) => {
    expect(decideAfterAttempt(f)).toMatchObject(want);
  });

  it('doubles the delay per attempt, with jitter between half and all of it', () => {
    expect([2, 3, 4, 5].map((n) => backoffMs(n, 1000, 0))).toEqual([500, 1000, 2000, 4000]);
    expect([2, 3, 4, 5].map((n) => backoffMs(n, 1000, 1))).toEqual([1000, 2000, 4000, 8000]);
    expect(backoffMs(3, 1000, 0.5)).toBe(1500);
  });

  it.each([0, 0.5, 0.999])('with the defaults, 8 attempts fit in the hour whatever the jitter (%s)', (random) => {
    // Every attempt fails; walk the schedule as the worker would with a clock that jumps to each due time.
    let now = T0;
    const times = [now];
    for (let attempt = 1; ; attempt++) {
      const d = decideAfterAttempt({ result: status(500), attempt, firstAttemptAt: T0, now, policy, random });
      if (d.outcome !== 'retried') {
        expect(d).toMatchObject({ outcome: 'failed', reason: expect.stringContaining('gave up after 8 attempt(s) (max_attempts)') });
        break;
      }
      now = d.nextAttemptAt;
      times.push(now);
    }
    expect(times).toHaveLength(8);
    const span = times.at(-1)! - T0;
    expect(span).toBeGreaterThanOrEqual(25_000 * 127 * 0.5 - 1);
    expect(span).toBeLessThanOrEqual(3600_000);
  });

  it('a short max age cuts the schedule before max_attempts', () => {
    const p = { maxAttempts: 100, maxAgeMs: 60_000, baseDelayMs: 10_000 };
    let now = T0;
    let n = 0;
    for (let attempt = 1; attempt < 100; attempt++) {
      const d = decideAfterAttempt({ result: status(500), attempt, firstAttemptAt: T0, now, policy: p, random: 1 });
      n = attempt;
      if (d.outcome !== 'retried') break;
      now = d.nextAttemptAt;
    }
    // 10 + 20 s of delays fit in 60 s, 10 + 20 + 40 do not: three attempts.
    expect(n).toBe(3);
  });
});
