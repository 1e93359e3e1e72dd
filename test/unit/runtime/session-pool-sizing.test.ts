/** The session pool's sizing (issue 19): targets from config and demand, starts and retirements. */
import { describe, expect, it } from 'vitest';
import { planSessionPool, sessionPoolTargets } from '../../../src/runtime/session-pool-sizing.ts';

const NOW = 1_000_000_000;
const IDLE = 300_000;

describe('sessionPoolTargets', () => {
  it.each([
    // configured, last opened (ms ago, null: never) → target
    [1, null, 1],
    [0, null, 0],
    [0, 10_000, 1], // used lately: the demand floor
    [0, IDLE - 1, 1],
    [0, IDLE, 0], // quiet for max_idle_sec: back to zero
    [3, 10_000, 3], // the floor never lowers a configured size
    [2, IDLE * 10, 2], // configured ones stay however quiet
  ])('configured %i, opened %s ms ago → %i', (configured, ago, want) => {
    const t = sessionPoolTargets(NOW, [{ jobType: 'a', configured, lastOpenedAt: ago === null ? null : NOW - ago }], IDLE);
    expect(t.get('a')).toBe(want);
  });

  it('sizes each job type on its own', () => {
    const t = sessionPoolTargets(NOW, [{ jobType: 'default', configured: 1, lastOpenedAt: null }, { jobType: 'ml', configured: 0, lastOpenedAt: NOW - 5 }, { jobType: 'old', configured: 0, lastOpenedAt: NOW - IDLE - 1 }], IDLE);
    expect(Object.fromEntries(t)).toEqual({ default: 1, ml: 1, old: 0 });
  });
});

describe('planSessionPool', () => {
  it.each([
    // target, ready (ms ago started), starting, budget → start, retire
    { target: 1, ready: [], starting: 0, budget: 1, start: 1, retire: [] },
    { target: 1, ready: [], starting: 1, budget: 1, start: 0, retire: [] }, // one on its way
    { target: 3, ready: [1000], starting: 0, budget: 1, start: 1, retire: [] }, // bounded by the budget
    { target: 3, ready: [1000], starting: 0, budget: 5, start: 2, retire: [] },
    { target: 2, ready: [1000], starting: 0, budget: 0, start: 0, retire: [] }, // no budget left
    { target: 1, ready: [IDLE * 2], starting: 0, budget: 1, start: 0, retire: [] }, // up to target: kept however old
    { target: 0, ready: [1000], starting: 0, budget: 1, start: 0, retire: [] }, // over target but fresh: waits
    { target: 0, ready: [IDLE], starting: 0, budget: 1, start: 0, retire: [0] }, // over target and idle: retired
    { target: 1, ready: [IDLE + 5, IDLE * 3, 10], starting: 0, budget: 1, start: 0, retire: [1, 0] }, // oldest first, keeps the target
    { target: 1, ready: [IDLE * 3], starting: 1, budget: 1, start: 0, retire: [0] }, // a starting one counts
  ])('target $target, ready $ready, starting $starting → start $start, retire $retire', ({ target, ready, starting, budget, start, retire }) => {
    const plan = planSessionPool(NOW, { target, ready: ready.map((ago) => NOW - ago), starting }, IDLE, budget);
    expect(plan).toEqual({ start, retire });
  });
});
