/** The API call gate: a limit on calls at work, first come first served, aborts while waiting, urgent calls. */
import { describe, expect, it } from 'vitest';
import { CallGate } from '../../../src/kube/call-gate.ts';

const settled = async <T>(p: Promise<T>): Promise<'pending' | 'resolved' | 'rejected'> => {
  let state: 'pending' | 'resolved' | 'rejected' = 'pending';
  p.then(
    () => (state = 'resolved'),
    () => (state = 'rejected'),
  );
  await new Promise((r) => setImmediate(r));
  return state;
};

describe('CallGate', () => {
  it('lets `limit` calls in and the rest in the order they came, one per call that leaves', async () => {
    const gate = new CallGate(2);
    const never = new AbortController().signal;
    const order: number[] = [];
    const entries = [0, 1, 2, 3, 4].map((i) => gate.enter(never).then(() => order.push(i)));
    await new Promise((r) => setImmediate(r));
    expect(order).toEqual([0, 1]);
    expect(gate.inUse).toBe(2);
    expect(gate.queued).toBe(3);
    gate.leave();
    await new Promise((r) => setImmediate(r));
    expect(order).toEqual([0, 1, 2]);
    gate.leave();
    gate.leave();
    await Promise.all(entries);
    expect(order).toEqual([0, 1, 2, 3, 4]);
    expect(gate.inUse).toBe(2);
    expect(gate.queued).toBe(0);
  });

  it('a call aborted while it waits rejects with the reason and gives up its place; the next one goes', async () => {
    const gate = new CallGate(1);
    await gate.enter(new AbortController().signal);
    const a = new AbortController();
    const first = gate.enter(a.signal);
    const second = gate.enter(new AbortController().signal);
    a.abort(new Error('deadline'));
    await expect(first).rejects.toThrow('deadline');
    expect(gate.queued).toBe(1);
    gate.leave();
    expect(await settled(second)).toBe('resolved');
    expect(gate.inUse).toBe(1);
  });

  it('an already aborted call does not enter', async () => {
    const gate = new CallGate(1);
    const a = new AbortController();
    a.abort(new Error('gone'));
    await expect(gate.enter(a.signal)).rejects.toThrow('gone');
    expect(gate.inUse).toBe(0);
  });

  it('an urgent call goes at once even when the gate is full, and counts while at work', async () => {
    const gate = new CallGate(1);
    const never = new AbortController().signal;
    await gate.enter(never);
    const waiting = gate.enter(never);
    expect(await settled(gate.enter(never, true))).toBe('resolved');
    expect(gate.inUse).toBe(2);
    // Two leave: the waiting call goes only once fewer than the limit are at work.
    gate.leave();
    expect(await settled(waiting)).toBe('pending');
    gate.leave();
    expect(await settled(waiting)).toBe('resolved');
  });
});
