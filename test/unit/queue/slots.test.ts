import { getEventListeners } from 'node:events';
import { describe, expect, it } from 'vitest';
import { Slots } from '../../../src/queue/slots.ts';

describe('Slots', () => {
  it('bounds concurrency and serves priority waiters first', async () => {
    const s = new Slots(1);
    await s.acquire();
    const order: string[] = [];
    const a = s.acquire(false).then(() => order.push('async'));
    const b = s.acquire(true).then(() => order.push('sync'));
    expect(s.waiting).toBe(2);
    s.release();
    await b;
    s.release();
    await a;
    expect(order).toEqual(['sync', 'async']);
    s.release();
    expect(s.busy).toBe(0);
  });

  it('an aborted waiter leaves the line', async () => {
    const s = new Slots(1);
    await s.acquire();
    const ac = new AbortController();
    const p = s.acquire(true, ac.signal);
    ac.abort(new Error('client went away'));
    await expect(p).rejects.toThrow('client went away');
    expect(s.waiting).toBe(0);
  });

  it('a granted wait leaves no listener on a long-lived signal', async () => {
    const s = new Slots(1);
    const ac = new AbortController();
    await s.acquire(false, ac.signal);
    for (let i = 0; i < 20; i++) {
      const next = s.acquire(false, ac.signal);
      s.release();
      await next;
    }
    expect(getEventListeners(ac.signal, 'abort')).toHaveLength(0);
  });
});
