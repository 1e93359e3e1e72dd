import { describe, expect, it } from 'vitest';
import { changedSince, checkTiming, decideLease, DEFAULT_TIMING, mustStepDown, releasedRecord, type LeaseRecord } from '../../../src/kube/lease-decide.ts';

const T = DEFAULT_TIMING; // 15 s / 10 s / 2 s
const rec = (over: Partial<LeaseRecord> = {}): LeaseRecord => ({ holder: 'b', leaseDurationSec: 15, acquireMs: 0, renewMs: 1_000, transitions: 2, resourceVersion: '7', ...over });

describe('decideLease', () => {
  it.each([
    // [case, now, current, observed (record, changedAt), expected kind]
    ['no Lease: create it', 100_000, null, null, 'create'],
    ['ours: renew', 100_000, rec({ holder: 'a' }), null, 'renew'],
    ['released (empty holder): take at once', 100_000, rec({ holder: '' }), null, 'take'],
    ['first sight of a live holder: follow (the clock starts now, whatever renewTime says)', 100_000, rec({ renewMs: 0 }), null, 'follow'],
    ['unchanged for less than the duration: follow', 100_000, rec(), { record: rec(), changedAtMs: 86_000 }, 'follow'],
    ['unchanged for exactly the duration: take', 101_000, rec(), { record: rec(), changedAtMs: 86_000 }, 'take'],
    ['renewed since we looked: the wait starts again', 101_000, rec({ renewMs: 99_000, resourceVersion: '8' }), { record: rec(), changedAtMs: 86_000 }, 'follow'],
    ['a holder with a longer duration is waited for longer', 101_000, rec({ leaseDurationSec: 60 }), { record: rec({ leaseDurationSec: 60 }), changedAtMs: 86_000 }, 'follow'],
  ] as const)('%s', (_c, now, current, observed, kind) => {
    expect(decideLease(now, 'a', current, observed, T).kind).toBe(kind);
  });

  it('create holds the Lease from now, with our duration and no transitions', () => {
    expect(decideLease(5_000, 'a', null, null, T)).toEqual({ kind: 'create', record: { holder: 'a', leaseDurationSec: 15, acquireMs: 5_000, renewMs: 5_000, transitions: 0, resourceVersion: '' } });
  });

  it('renew keeps acquireTime and transitions and writes at the resourceVersion read', () => {
    const step = decideLease(9_000, 'a', rec({ holder: 'a', acquireMs: 3_000 }), null, T);
    expect(step).toEqual({ kind: 'renew', record: rec({ holder: 'a', acquireMs: 3_000, renewMs: 9_000 }) });
  });

  it('take counts a transition and writes at the resourceVersion read (so a racing replica gets 409)', () => {
    const step = decideLease(200_000, 'a', rec({ holder: '' }), null, T);
    expect(step).toEqual({ kind: 'take', record: { holder: 'a', leaseDurationSec: 15, acquireMs: 200_000, renewMs: 200_000, transitions: 3, resourceVersion: '7' } });
  });

  it('follow says from when the Lease may be taken', () => {
    expect(decideLease(90_000, 'a', rec(), { record: rec(), changedAtMs: 86_000 }, T)).toEqual({ kind: 'follow', holder: 'b', expiresAtMs: 101_000 });
  });
});

describe('the rest of the rules', () => {
  it('changedSince keeps the first observation while holder, renewTime and resourceVersion stay', () => {
    expect(changedSince(50, rec(), { record: rec(), changedAtMs: 10 })).toBe(10);
    expect(changedSince(50, rec({ holder: 'c' }), { record: rec(), changedAtMs: 10 })).toBe(50);
    expect(changedSince(50, rec({ renewMs: 2 }), { record: rec(), changedAtMs: 10 })).toBe(50);
    expect(changedSince(50, rec(), null)).toBe(50);
  });

  it('a released record has no holder and a 1 s duration', () => {
    expect(releasedRecord(rec({ holder: 'a' }), 77)).toMatchObject({ holder: '', leaseDurationSec: 1, renewMs: 77, transitions: 2, resourceVersion: '7' });
  });

  it.each([
    [9_999, false],
    [10_000, true],
  ])('a leader %i ms after its last renew must step down: %s', (elapsed, down) => {
    expect(mustStepDown(1_000 + elapsed, 1_000, T)).toBe(down);
  });

  it.each([
    [{ leaseDurationMs: 15_000, renewDeadlineMs: 10_000, retryPeriodMs: 2_000 }, true],
    [{ leaseDurationMs: 10_000, renewDeadlineMs: 10_000, retryPeriodMs: 2_000 }, false],
    [{ leaseDurationMs: 15_000, renewDeadlineMs: 2_000, retryPeriodMs: 2_000 }, false],
    [{ leaseDurationMs: 15_000, renewDeadlineMs: 10_000, retryPeriodMs: 0 }, false],
  ])('timing %o is accepted: %s', (t, ok) => {
    if (ok) expect(() => checkTiming(t)).not.toThrow();
    else expect(() => checkTiming(t)).toThrow(/retry period .* < renew deadline .* < lease duration/);
  });
});
