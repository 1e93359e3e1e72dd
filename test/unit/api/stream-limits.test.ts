/** The event-stream caps (issue 22 item 8): per key, then in all; a release frees exactly one place, once. */
import { describe, expect, it } from 'vitest';
import { SHARED_KEY, StreamLimits, type StreamTicket } from '../../../src/api/stream-limits.ts';

const ok = (t: ReturnType<StreamLimits['acquire']>): StreamTicket => {
  if ('refused' in t) throw new Error(`refused: ${t.detail}`);
  return t;
};

describe('StreamLimits', () => {
  it('refuses past the per-key cap first, then past the total, naming the setting', () => {
    const l = new StreamLimits(3, 2);
    const a = [ok(l.acquire('a')), ok(l.acquire('a'))];
    expect(l.acquire('a')).toMatchObject({ refused: 'per_token', detail: expect.stringContaining('http.max_event_streams_per_token 2') });
    ok(l.acquire('b'));
    expect(l.acquire('c')).toMatchObject({ refused: 'total', detail: expect.stringContaining('http.max_event_streams 3') });
    expect(l.open).toBe(3);
    a[0]!.release();
    a[0]!.release(); // twice: still one place
    expect(l.open).toBe(2);
    ok(l.acquire('c'));
    expect(l.acquire('c')).toMatchObject({ refused: 'total' });
  });

  it('without tokens the message says all callers share the allowance', () => {
    const l = new StreamLimits(10, 1);
    ok(l.acquire(SHARED_KEY));
    expect(l.acquire(SHARED_KEY)).toMatchObject({ refused: 'per_token', detail: expect.stringContaining('callers without a token') });
  });
});
