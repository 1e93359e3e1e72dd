/** What becomes of an async job the machinery failed (issue 22 item 4): the pure decision, as a table. */
import { describe, expect, it } from 'vitest';
import { afterFault, MAX_INFRA_REQUEUES, type FaultFacts } from '../../../src/executions/requeue.ts';

const base: FaultFacts = { mode: 'async', kind: 'engine', engineCalls: 2, userCodeStarted: false, infraFailures: 0, breakerRetryInMs: 0 };

describe('afterFault', () => {
  it.each([
    { name: 'breaker refused before any engine call: requeued after its recovery, nothing counted', f: { kind: 'rejected', engineCalls: 0, breakerRetryInMs: 25_000, infraFailures: 3 }, want: { action: 'requeue', delayMs: 25_000, infraFailures: 3 } },
    { name: 'breaker refused, recovery almost over: at least the base backoff', f: { kind: 'rejected', engineCalls: 0, breakerRetryInMs: 10 }, want: { action: 'requeue', delayMs: 1000, infraFailures: 0 } },
    { name: 'breaker refused the retry after a failure: counted', f: { kind: 'rejected', engineCalls: 1, breakerRetryInMs: 30_000 }, want: { action: 'requeue', delayMs: 30_000, infraFailures: 1 } },
    { name: 'first engine failure before user code: 1 s', f: {}, want: { action: 'requeue', delayMs: 1000, infraFailures: 1 } },
    { name: 'third: 4 s', f: { infraFailures: 2 }, want: { action: 'requeue', delayMs: 4000, infraFailures: 3 } },
    { name: 'the breaker opened meanwhile: not before it recovers', f: { infraFailures: 1, breakerRetryInMs: 9000 }, want: { action: 'requeue', delayMs: 9000, infraFailures: 2 } },
    { name: `the ${MAX_INFRA_REQUEUES}th requeue is the last`, f: { infraFailures: MAX_INFRA_REQUEUES - 1 }, want: { action: 'requeue', delayMs: 16_000, infraFailures: MAX_INFRA_REQUEUES } },
    { name: 'past the bound: fails, its key may be reused', f: { infraFailures: MAX_INFRA_REQUEUES }, want: { action: 'settle', failedBeforeStart: true } },
    { name: 'user code had started: never run again', f: { userCodeStarted: true }, want: { action: 'settle', failedBeforeStart: false } },
    { name: "user code's own result", f: { kind: 'other' }, want: { action: 'settle', failedBeforeStart: false } },
    { name: 'sync: the caller gets the failure (marked before start)', f: { mode: 'sync' }, want: { action: 'settle', failedBeforeStart: true } },
    { name: 'sync, breaker open', f: { mode: 'sync', kind: 'rejected', engineCalls: 0 }, want: { action: 'settle', failedBeforeStart: true } },
  ] as { name: string; f: Partial<FaultFacts>; want: unknown }[])('$name', ({ f, want }) => {
    expect(afterFault({ ...base, ...f })).toEqual(want);
  });

  it('backoff is capped at 30 s', () => {
    expect(afterFault({ ...base, infraFailures: 9 }, 20)).toEqual({ action: 'requeue', delayMs: 30_000, infraFailures: 10 });
  });
});
