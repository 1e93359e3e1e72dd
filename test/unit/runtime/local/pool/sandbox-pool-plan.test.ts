import { describe, expect, it } from 'vitest';
import { backoffMs, BASE_BACKOFF_MS, MAX_BACKOFF_MS, pickWarm, planPool, START_TIMEOUT_MS, type FailureRecord, type PoolEntryView, type PoolState } from '../../../../../src/runtime/local/pool/sandbox-pool-plan.ts';

const T = 1_000_000;
const IDLE = 60_000;

const ready = (id: string, key: string, age: number): PoolEntryView => ({ id, key, state: 'ready', createdAt: T - age });
const starting = (id: string, key: string, age: number): PoolEntryView => ({ id, key, state: 'starting', createdAt: T - age });

function state(over: Partial<Omit<PoolState, 'targets' | 'failures'>> & { targets?: Record<string, number>; failures?: Record<string, FailureRecord> } = {}): PoolState {
  const { targets, failures, ...rest } = over;
  return {
    now: T,
    maxIdleMs: IDLE,
    targets: new Map(Object.entries(targets ?? { a: 2 })),
    entries: [],
    maxStarting: 2,
    failures: new Map(Object.entries(failures ?? {})),
    ...rest,
  };
}

describe('planPool', () => {
  const cases: { name: string; s: PoolState; retire: string[]; start: string[]; wakeAt: number | null }[] = [
    { name: 'an empty pool starts up to its target', s: state(), retire: [], start: ['a', 'a'], wakeAt: null },
    { name: 'a full pool does nothing and wakes when its oldest expires', s: state({ entries: [ready('1', 'a', 10), ready('2', 'a', 20)] }), retire: [], start: [], wakeAt: T - 20 + IDLE },
    { name: 'starting sandboxes count toward the target', s: state({ entries: [starting('1', 'a', 5)] }), retire: [], start: ['a'], wakeAt: T - 5 + START_TIMEOUT_MS },
    { name: 'a sandbox idle for max_idle is retired and replaced', s: state({ entries: [ready('1', 'a', IDLE), ready('2', 'a', 100)] }), retire: ['1'], start: ['a'], wakeAt: T - 100 + IDLE },
    { name: 'one just younger than max_idle stays', s: state({ entries: [ready('1', 'a', IDLE - 1), ready('2', 'a', 100)] }), retire: [], start: [], wakeAt: T + 1 },
    { name: 'a sandbox stuck starting is retired', s: state({ entries: [starting('1', 'a', START_TIMEOUT_MS), ready('2', 'a', 1)] }), retire: ['1'], start: ['a'], wakeAt: T - 1 + IDLE },
    { name: 'keys no longer wanted lose their sandboxes', s: state({ entries: [ready('1', 'gone', 1)], targets: {} }), retire: ['1'], start: [], wakeAt: null },
    {
      name: 'a lowered size retires the oldest first',
      s: state({ targets: { a: 1 }, entries: [ready('new', 'a', 1), ready('old', 'a', 500), ready('mid', 'a', 200)] }),
      retire: ['old', 'mid'],
      start: [],
      wakeAt: T - 1 + IDLE,
    },
    { name: 'max_starting bounds concurrent starts', s: state({ targets: { a: 5 }, entries: [starting('1', 'a', 1)] }), retire: [], start: ['a'], wakeAt: T - 1 + START_TIMEOUT_MS },
    { name: 'keys take turns within max_starting', s: state({ targets: { a: 3, b: 3 }, maxStarting: 3 }), retire: [], start: ['a', 'b', 'a'], wakeAt: null },
    { name: 'nothing starts while max_starting are starting', s: state({ targets: { a: 4 }, entries: [starting('1', 'a', 1), starting('2', 'a', 1)] }), retire: [], start: [], wakeAt: T - 1 + START_TIMEOUT_MS },
    {
      name: 'a key in back-off waits and wakes at its end; others go on',
      s: state({ targets: { a: 1, b: 1 }, failures: { a: { count: 2, lastAt: T - 100 } } }),
      retire: [],
      start: ['b'],
      wakeAt: T - 100 + backoffMs(2),
    },
    { name: 'a key whose back-off is over starts again', s: state({ targets: { a: 1 }, failures: { a: { count: 1, lastAt: T - BASE_BACKOFF_MS } } }), retire: [], start: ['a'], wakeAt: null },
    { name: 'size 0 keeps none', s: state({ targets: { a: 0 }, entries: [ready('1', 'a', 1)] }), retire: ['1'], start: [], wakeAt: null },
  ];
  it.each(cases)('$name', ({ s, retire, start, wakeAt }) => {
    const plan = planPool(s);
    expect(plan.retire.sort()).toEqual([...retire].sort());
    expect(plan.start).toEqual(start);
    expect(plan.wakeAt).toBe(wakeAt);
  });

  it('follows an injected clock: the same pool, later, retires what aged out', () => {
    const entries = [ready('1', 'a', 0), ready('2', 'a', 0)];
    expect(planPool(state({ entries })).retire).toEqual([]);
    expect(planPool(state({ entries, now: T + IDLE - 1 })).retire).toEqual([]);
    expect(planPool(state({ entries, now: T + IDLE })).retire.sort()).toEqual(['1', '2']);
    expect(planPool(state({ entries, now: T + IDLE })).start).toEqual(['a', 'a']);
  });
});

describe('backoffMs', () => {
  it.each([
    [0, 0],
    [1, BASE_BACKOFF_MS],
    [2, 2 * BASE_BACKOFF_MS],
    [3, 4 * BASE_BACKOFF_MS],
    [30, MAX_BACKOFF_MS],
  ])('after %i failures: %i ms', (n, want) => {
    expect(backoffMs(n)).toBe(want);
  });
});

describe('pickWarm', () => {
  const cases: { name: string; entries: PoolEntryView[]; key: string; now?: number; want: string | null }[] = [
    { name: 'none: a miss', entries: [], key: 'a', want: null },
    { name: 'the oldest ready one of the key', entries: [ready('young', 'a', 10), ready('old', 'a', 500), ready('other', 'b', 900)], key: 'a', want: 'old' },
    { name: 'never a starting one', entries: [starting('s', 'a', 900)], key: 'a', want: null },
    { name: 'never another key', entries: [ready('b1', 'b', 10)], key: 'a', want: null },
    { name: 'never one past max_idle', entries: [ready('stale', 'a', IDLE), ready('fresh', 'a', 5)], key: 'a', want: 'fresh' },
    { name: 'nothing when all are stale by a later clock', entries: [ready('1', 'a', 5)], key: 'a', now: T + IDLE, want: null },
  ];
  it.each(cases)('$name', ({ entries, key, now, want }) => {
    expect(pickWarm(entries, key, now ?? T, IDLE)).toBe(want);
  });
});
