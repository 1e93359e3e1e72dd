import { describe, expect, it } from 'vitest';
import { claimRate, DEFAULT_REFILL_MS, erlangB, sandboxesFor, sizePool, type KeyDemand, type SizingOptions } from '../../../../../src/runtime/local/pool/pool-sizing.ts';

const O: SizingOptions = { maxPerType: 8, maxTotal: 16, windowMs: 60_000, idleMs: 300_000, missTarget: 0.1 };
const NOW = 1_000_000_000;
/** `n` claims evenly over the last minute. */
const perMinute = (n: number) => Array.from({ length: n }, (_, i) => NOW - i * (60_000 / n));
const key = (over: Partial<KeyDemand>): KeyDemand => ({ key: 'k', base: 1, claims: [], refillMs: 1000, since: NOW - 1000, ...over });

describe('erlangB', () => {
  it.each([
    [0, 1, 1],
    [1, 1, 0.5],
    [2, 1, 0.2],
    [3, 2, 4 / 19],
    [1, 0, 0],
  ])('B(%i, %f) = %f', (n, a, want) => {
    expect(erlangB(n, a)).toBeCloseTo(want, 10);
  });
});

describe('sandboxesFor', () => {
  it.each([
    // offered load, miss target, max → n
    [0, 0.1, 8, 0],
    [0.05, 0.1, 8, 1], // B(1, .05) = .048
    [0.5, 0.1, 8, 2], // B(1, .5) = .33, B(2, .5) = .077
    [2, 0.1, 8, 4], // B(3, 2) = .21, B(4, 2) = .095
    [2, 0.01, 8, 7],
    [50, 0.1, 8, 8], // capped
  ])('load %f, target %f, max %i → %i', (a, t, max, want) => {
    expect(sandboxesFor(a, t, max)).toBe(want);
  });
});

describe('claimRate', () => {
  it('counts the claims inside the window only', () => {
    expect(claimRate([NOW - 1, NOW - 59_999, NOW - 60_000, NOW - 120_000, NOW + 5], NOW, 60_000)).toBeCloseTo(2 / 60, 10);
  });
});

describe('sizePool', () => {
  it.each<[string, Partial<KeyDemand>, Partial<SizingOptions>, number]>([
    ['no claims yet, just started: the configured size', { claims: [] }, {}, 1],
    ['a quiet key keeps its configured size', { claims: perMinute(2), base: 2 }, {}, 2],
    ['1 claim/s × 2 s refill (A = 2): 4 keep misses under 10 %', { claims: perMinute(60), refillMs: 2000 }, {}, 4],
    ['the same with a 0.1 s refill (A = 0.1, B(1) = 0.09): 1 is enough', { claims: perMinute(60), refillMs: 100 }, {}, 1],
    ['slow refills (restore unavailable, A = 10): capped at max_per_type', { claims: perMinute(60), refillMs: 10_000 }, {}, 8],
    ['an unmeasured refill counts as DEFAULT_REFILL_MS', { claims: perMinute(60), refillMs: null }, {}, sandboxesFor(DEFAULT_REFILL_MS / 1000, 0.1, 8)],
    ['idle past idleMs (last claim 301 s ago): zero', { claims: [NOW - 301_000], since: NOW - 400_000 }, {}, 0],
    ['idle since it became a target, never claimed: zero', { claims: [], since: NOW - 300_000 }, {}, 0],
    ['claimed 299 s ago: still its base', { claims: [NOW - 299_000], since: NOW - 400_000 }, {}, 1],
  ])('%s', (_name, demand, opts, want) => {
    expect(sizePool(NOW, [key(demand)], { ...O, ...opts }).get('k')).toBe(want);
  });

  it('bounds the total by cutting the largest targets first', () => {
    const keys = [key({ key: 'a', claims: perMinute(60), refillMs: 10_000 }), key({ key: 'b', claims: perMinute(60), refillMs: 2000 }), key({ key: 'c', base: 1 })];
    // Alone: a 8, b 4, c 1 (13); within 8: a gives up first until it is level with b, then the first by name.
    expect(Object.fromEntries(sizePool(NOW, keys, O))).toEqual({ a: 8, b: 4, c: 1 });
    expect(Object.fromEntries(sizePool(NOW, keys, { ...O, maxTotal: 8 }))).toEqual({ a: 3, b: 4, c: 1 });
    expect(Object.fromEntries(sizePool(NOW, keys, { ...O, maxTotal: 3 }))).toEqual({ a: 1, b: 1, c: 1 });
  });

  it('follows an injected clock: the same claims size down as they leave the window, to zero when idle', () => {
    const claims = perMinute(60);
    const k = key({ claims, refillMs: 2000, base: 0 });
    expect(sizePool(NOW, [k], O).get('k')).toBe(4);
    expect(sizePool(NOW + 30_000, [k], O).get('k')).toBe(sandboxesFor(1, 0.1, 8));
    expect(sizePool(NOW + 61_000, [k], O).get('k')).toBe(0);
    expect(sizePool(NOW + 300_000, [{ ...k, base: 3 }], O).get('k')).toBe(0);
  });
});
