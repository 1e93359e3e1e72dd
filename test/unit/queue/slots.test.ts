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
});
