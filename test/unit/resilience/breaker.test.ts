import { describe, expect, it } from 'vitest';
import { BreakerOpenError, CircuitBreaker } from '../../../src/resilience/breaker.ts';
import { backoffDelay, RetriesExhaustedError, withRetry } from '../../../src/resilience/retry.ts';
import { UnretryableError } from '../../../src/errors.ts';

function clocked() {
  let t = 1_000_000;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}
const fail = () => Promise.reject(new Error('engine down'));
const ok = () => Promise.resolve('ok');

describe('CircuitBreaker (SPEC §3)', () => {
  it('opens after exactly 5 consecutive failures', async () => {
    const c = clocked();
    const b = new CircuitBreaker({ clock: c });
    for (let i = 0; i < 4; i++) await expect(b.exec(fail)).rejects.toThrow('engine down');
    expect(b.state).toBe('closed');
    expect(b.snapshot().failure_count).toBe(4);
    await expect(b.exec(fail)).rejects.toThrow('engine down');
    expect(b.state).toBe('open');
    await expect(b.exec(ok)).rejects.toBeInstanceOf(BreakerOpenError);
    expect(b.snapshot().last_failure).toBe(new Date(c.now()).toISOString());
  });

  it('a success resets the consecutive count', async () => {
    const b = new CircuitBreaker({ clock: clocked() });
    for (let i = 0; i < 4; i++) await b.exec(fail).catch(() => {});
    await b.exec(ok);
    for (let i = 0; i < 4; i++) await b.exec(fail).catch(() => {});
    expect(b.state).toBe('closed');
  });

  it('half-open after 30 s, closed after 2 successes', async () => {
    const c = clocked();
    const b = new CircuitBreaker({ clock: c });
    for (let i = 0; i < 5; i++) await b.exec(fail).catch(() => {});
    c.advance(29_999);
    expect(b.state).toBe('open');
    c.advance(1);
    expect(b.state).toBe('half_open');
    await b.exec(ok);
    expect(b.state).toBe('half_open');
    expect(b.snapshot().success_count).toBe(1);
    await b.exec(ok);
    expect(b.state).toBe('closed');
    expect(b.snapshot().failure_count).toBe(0);
  });

  it('a failure while half-open opens again', async () => {
    const c = clocked();
    const b = new CircuitBreaker({ clock: c });
    for (let i = 0; i < 5; i++) await b.exec(fail).catch(() => {});
    c.advance(30_000);
    await b.exec(ok);
    await b.exec(fail).catch(() => {});
    expect(b.state).toBe('open');
    c.advance(10_000);
    expect(b.state).toBe('open');
  });

  it('a resolved value can count as a failure', async () => {
    const b = new CircuitBreaker({ clock: clocked(), failureThreshold: 2 });
    await b.exec(() => Promise.resolve('infra'), (v) => v === 'infra');
    await b.exec(() => Promise.resolve('infra'), (v) => v === 'infra');
    expect(b.state).toBe('open');
  });
});

describe('withRetry (SPEC §7.3 rule 6)', () => {
  it('retries a transient failure once (2 attempts) with backoff', async () => {
    const delays: number[] = [];
    let calls = 0;
    const r = await withRetry(
      async () => {
        calls++;
        if (calls === 1) throw new Error('EAGAIN');
        return 'done';
      },
      { sleep: async (ms) => void delays.push(ms), random: () => 0.5 },
    );
    expect(r).toBe('done');
    expect(calls).toBe(2);
    expect(delays).toEqual([750]);
  });

  it('gives up after 2 attempts', async () => {
    let calls = 0;
    const err = await withRetry(async () => {
      calls++;
      throw new Error('still down');
    }, { sleep: async () => {} }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RetriesExhaustedError);
    expect((err as RetriesExhaustedError).attempts).toBe(2);
    expect((err as RetriesExhaustedError).name).toBe('RetriesExhaustedError');
    expect(calls).toBe(2);
  });

  it('does not retry unretryable errors or an open breaker', async () => {
    let calls = 0;
    await expect(withRetry(async () => { calls++; throw new UnretryableError('bad spec'); }, { sleep: async () => {} })).rejects.toBeInstanceOf(UnretryableError);
    await expect(withRetry(async () => { calls++; throw new BreakerOpenError(1000); }, { sleep: async () => {} })).rejects.toBeInstanceOf(BreakerOpenError);
    expect(calls).toBe(2);
  });

  it('backoff is exponential with jitter in [0.5, 1) of the step', () => {
    expect(backoffDelay(1, 1000, 30_000, () => 0)).toBe(500);
    expect(backoffDelay(2, 1000, 30_000, () => 0)).toBe(1000);
    expect(backoffDelay(3, 1000, 30_000, () => 0.999)).toBeGreaterThan(3990);
    expect(backoffDelay(10, 1000, 30_000, () => 0.999)).toBeLessThanOrEqual(30_000);
  });
});

describe('CircuitBreaker: what it reports', () => {
  async function opened(c = clocked()) {
    const changes: string[] = [];
    const b = new CircuitBreaker({ clock: c, onStateChange: (from, to) => changes.push(`${from}->${to}`) });
    for (let i = 0; i < 5; i++) await b.exec(fail).catch(() => {});
    return { b, c, changes };
  }

  it('the open error says how long is left, in whole seconds rounded up', async () => {
    const { b, c } = await opened();
    c.advance(10_400);
    const err = (await b.exec(ok).catch((e: unknown) => e)) as BreakerOpenError;
    expect(err).toBeInstanceOf(BreakerOpenError);
    expect(err.name).toBe('BreakerOpenError');
    expect(err.retryAfterMs).toBe(19_600);
    expect(err.message).toBe('circuit breaker is open: the sandbox engine failed repeatedly; retry in 20 s');
  });

  it('snapshot: no last failure at first; the failure count stays while open and resets on closing', async () => {
    expect(new CircuitBreaker({ clock: clocked() }).snapshot()).toEqual({ state: 'closed', failure_count: 0, success_count: 0, last_failure: null });
    const { b, c, changes } = await opened();
    expect(b.snapshot()).toMatchObject({ state: 'open', failure_count: 5, success_count: 0 });
    // Counts reported straight to an open breaker change nothing.
    b.recordSuccess();
    b.recordFailure();
    expect(b.snapshot()).toMatchObject({ state: 'open', failure_count: 5, success_count: 0 });
    c.advance(30_000);
    expect(b.state).toBe('half_open');
    expect(b.snapshot().failure_count).toBe(5);
    await b.exec(ok);
    expect(b.snapshot()).toMatchObject({ state: 'half_open', success_count: 1 });
    await b.exec(ok);
    expect(b.snapshot()).toMatchObject({ state: 'closed', failure_count: 0, success_count: 0 });
    expect(changes).toEqual(['closed->open', 'open->half_open', 'half_open->closed']);
  });

  it('a resolved value counts as a success unless isFailure says otherwise', async () => {
    const b = new CircuitBreaker({ clock: clocked() });
    for (let i = 0; i < 4; i++) await b.exec(fail).catch(() => {});
    expect(await b.exec(ok)).toBe('ok');
    expect(b.snapshot()).toMatchObject({ failure_count: 0, success_count: 1 });
  });
});
