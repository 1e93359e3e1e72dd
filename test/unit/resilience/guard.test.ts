/**
 * The one guard policy (SPEC §3, §7.3 rules 5-6) as a table: each row scripts what the engine does per
 * attempt and states what the guard must answer, how often the engine was called, how the breaker
 * counted, and which backoffs were slept. Clock and sleep are injected; nothing waits.
 */
import { describe, expect, it } from 'vitest';
import { UnretryableError } from '../../../src/errors.ts';
import { BreakerOpenError, CircuitBreaker } from '../../../src/resilience/breaker.ts';
import { RunGuard, type GuardCall } from '../../../src/resilience/guard.ts';

/** What the engine does on one attempt. */
type Step = { throws: unknown } | { resolves: 'ok' | 'engine_failure' | 'user_failure' };

const transient = () => Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
class GoneError extends Error {}

function harness(opts: { failureThreshold?: number; attempts?: number; random?: number } = {}) {
  let t = 1_000_000;
  const clock = { now: () => t };
  const breaker = new CircuitBreaker({ clock, failureThreshold: opts.failureThreshold ?? 5, recoveryTimeoutMs: 30_000, successThreshold: 2 });
  const slept: number[] = [];
  const guard = new RunGuard({
    breaker,
    policy: { attempts: opts.attempts ?? 2, baseDelayMs: 1000 },
    sleep: async (ms) => {
      slept.push(ms);
      t += ms;
    },
    random: () => opts.random ?? 0.5,
  });
  return { breaker, guard, slept, advance: (ms: number) => (t += ms) };
}

function engine(steps: Step[]) {
  let calls = 0;
  const fn = async (attempt: number) => {
    calls++;
    expect(attempt).toBe(calls);
    const s = steps[Math.min(calls, steps.length) - 1]!;
    if ('throws' in s) throw s.throws;
    return s.resolves;
  };
  return { fn, calls: () => calls };
}

const call: GuardCall<string> = {
  isEngineFailure: (v) => v === 'engine_failure',
  isNeutral: (err) => err instanceof GoneError,
};

describe('RunGuard: one policy around each run attempt', () => {
  const rows: {
    name: string;
    steps: Step[];
    retryable?: boolean;
    kind: 'ok' | 'rejected' | 'failed';
    attempts: number;
    calls: number;
    failures: number;
    successes: number;
    slept: number[];
  }[] = [
    { name: 'a clean run: one attempt, one success', steps: [{ resolves: 'ok' }], kind: 'ok', attempts: 1, calls: 1, failures: 0, successes: 1, slept: [] },
    {
      name: 'user code failing is a success of the engine',
      steps: [{ resolves: 'user_failure' }],
      kind: 'ok',
      attempts: 1,
      calls: 1,
      failures: 0,
      successes: 1,
      slept: [],
    },
    {
      name: 'a run that resolved with an engine failure counts once and is not retried',
      steps: [{ resolves: 'engine_failure' }],
      kind: 'ok',
      attempts: 1,
      calls: 1,
      failures: 1,
      successes: 0,
      slept: [],
    },
    {
      name: 'a transient throw is retried once after base·jitter; each failed attempt counts once',
      steps: [{ throws: transient() }, { throws: transient() }],
      kind: 'failed',
      attempts: 2,
      calls: 2,
      failures: 2,
      successes: 0,
      slept: [750],
    },
    {
      name: 'a transient throw then a clean run: one failure, then a success (which resets the count)',
      steps: [{ throws: transient() }, { resolves: 'ok' }],
      kind: 'ok',
      attempts: 2,
      calls: 2,
      failures: 0,
      successes: 1,
      slept: [750],
    },
    {
      name: 'an unretryable error counts once and is not retried',
      steps: [{ throws: new UnretryableError('bad spec') }],
      kind: 'failed',
      attempts: 1,
      calls: 1,
      failures: 1,
      successes: 0,
      slept: [],
    },
    {
      name: "an error the caller calls unretryable (the run was aborted) is not retried",
      steps: [{ throws: transient() }],
      retryable: false,
      kind: 'failed',
      attempts: 1,
      calls: 1,
      failures: 1,
      successes: 0,
      slept: [],
    },
    {
      name: 'a neutral error (nothing to re-attach to) is neither counted nor retried',
      steps: [{ throws: new GoneError('gone') }],
      kind: 'failed',
      attempts: 1,
      calls: 1,
      failures: 0,
      successes: 0,
      slept: [],
    },
    {
      name: 'an engine call refused by the breaker inside the run is a rejection, not another failure',
      steps: [{ throws: new BreakerOpenError(1000) }],
      kind: 'rejected',
      attempts: 1,
      calls: 1,
      failures: 0,
      successes: 0,
      slept: [],
    },
  ];

  it.each(rows)('$name', async (r) => {
    const h = harness();
    const e = engine(r.steps);
    const res = await h.guard.run(e.fn, { ...call, ...(r.retryable === undefined ? {} : { retryable: () => r.retryable! }) });
    expect(res.kind).toBe(r.kind);
    expect(res.attempts).toBe(r.attempts);
    expect(e.calls()).toBe(r.calls);
    expect(h.breaker.snapshot()).toMatchObject({ state: 'closed', failure_count: r.failures, success_count: r.successes });
    expect(h.slept).toEqual(r.slept);
    if (res.kind === 'failed') expect(res.error).toBe('throws' in r.steps[r.calls - 1]! ? (r.steps[r.calls - 1] as { throws: unknown }).throws : undefined);
  });

  it('open breaker: rejected at once (service_unavailable), the engine is not called, nothing slept', async () => {
    const h = harness();
    for (let i = 0; i < 5; i++) h.breaker.recordFailure();
    expect(h.breaker.state).toBe('open');
    const e = engine([{ resolves: 'ok' }]);
    const res = await h.guard.run(e.fn, call);
    expect(res).toMatchObject({ kind: 'rejected', attempts: 0 });
    expect(res.kind === 'rejected' && res.error).toBeInstanceOf(BreakerOpenError);
    expect(e.calls()).toBe(0);
    expect(h.slept).toEqual([]);
  });

  it('the failure that opens the breaker ends the run: no retry against an open circuit', async () => {
    const h = harness({ failureThreshold: 1 });
    const e = engine([{ throws: transient() }, { resolves: 'ok' }]);
    const res = await h.guard.run(e.fn, call);
    expect(res).toMatchObject({ kind: 'rejected', attempts: 1 });
    expect(e.calls()).toBe(1);
    expect(h.slept).toEqual([]);
    expect(h.breaker.state).toBe('open');
  });

  it('five failed attempts open the breaker (2 runs × 2 attempts + 1), counted once each', async () => {
    const h = harness();
    await h.guard.run(engine([{ throws: transient() }]).fn, call);
    await h.guard.run(engine([{ throws: transient() }]).fn, call);
    expect(h.breaker.snapshot()).toMatchObject({ state: 'closed', failure_count: 4 });
    await h.guard.run(engine([{ resolves: 'engine_failure' }]).fn, call);
    expect(h.breaker.state).toBe('open');
  });

  it('half-open after 30 s lets a run through; two clean runs close the circuit', async () => {
    const h = harness({ failureThreshold: 1 });
    expect(await h.guard.run(engine([{ throws: transient() }]).fn, call)).toMatchObject({ kind: 'rejected', attempts: 1 });
    h.advance(29_999);
    expect((await h.guard.run(engine([{ resolves: 'ok' }]).fn, call)).kind).toBe('rejected');
    h.advance(1);
    expect((await h.guard.run(engine([{ resolves: 'ok' }]).fn, call)).kind).toBe('ok');
    expect(h.breaker.state).toBe('half_open');
    expect((await h.guard.run(engine([{ resolves: 'ok' }]).fn, call)).kind).toBe('ok');
    expect(h.breaker.state).toBe('closed');
  });

  it.each([
    { random: 0, slept: [500, 1000] },
    { random: 0.5, slept: [750, 1500] },
    { random: 0.999, slept: [1000, 1999] },
  ])('backoff doubles per attempt with jitter in [½, 1) of it (random $random)', async ({ random, slept }) => {
    const h = harness({ attempts: 3, random });
    const e = engine([{ throws: transient() }]);
    const res = await h.guard.run(e.fn, call);
    expect(res).toMatchObject({ kind: 'failed', attempts: 3 });
    expect(h.slept).toEqual(slept);
  });
});

describe('RunGuard without optional hooks', () => {
  it('a call with no hooks: a failure is retried and counted, a value is a success', async () => {
    const h = harness();
    const e = engine([{ throws: transient() }, { resolves: 'ok' }]);
    const r = await h.guard.run(e.fn);
    expect(r).toMatchObject({ kind: 'ok', attempts: 2 });
    expect(h.breaker.snapshot()).toMatchObject({ failure_count: 0, success_count: 1 });
    expect(h.guard.breaker).toBe(h.breaker);
  });

  it('the default sleep really waits the backoff', async () => {
    const breaker = new CircuitBreaker({ failureThreshold: 5 });
    const guard = new RunGuard({ breaker, policy: { attempts: 2, baseDelayMs: 60 }, random: () => 0.99 });
    let calls = 0;
    const t0 = Date.now();
    const r = await guard.run(async () => {
      if (++calls === 1) throw transient();
      return 'ok';
    });
    expect(r).toMatchObject({ kind: 'ok', attempts: 2 });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(50);
  });

  it('a refusal carries the time left before the circuit half-opens', async () => {
    const h = harness({ failureThreshold: 1 });
    await h.guard.run(engine([{ throws: transient() }]).fn);
    h.advance(10_000);
    const r = await h.guard.run(engine([{ resolves: 'ok' }]).fn);
    expect(r.kind).toBe('rejected');
    expect(r.kind === 'rejected' && r.error.retryAfterMs).toBe(20_000);
  });
});
