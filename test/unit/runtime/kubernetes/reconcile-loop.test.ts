import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../../src/logger.ts';
import { ReconcileLoop, type Subscribe } from '../../../../src/runtime/kubernetes/reconcile-loop.ts';

/** An event source whose listeners the test fires and counts. */
function source() {
  const listeners = new Set<() => void>();
  const on: Subscribe = (cb) => {
    listeners.add(cb);
    return () => listeners.delete(cb);
  };
  return { on, fire: () => listeners.forEach((l) => l()), get count() { return listeners.size; } };
}

describe('ReconcileLoop', () => {
  it('runs one pass at a time; kicks during a pass coalesce into exactly one more', async () => {
    let passes = 0;
    let inside = 0;
    let most = 0;
    let release!: () => void;
    let gate = new Promise<void>((r) => (release = r));
    const loop = new ReconcileLoop(async () => {
      passes++;
      most = Math.max(most, ++inside);
      await gate;
      inside--;
    }, { what: 't', log: silentLogger, intervalMs: 60_000 });
    const s = source();
    loop.start([s.on]);
    expect(passes).toBe(1);
    s.fire();
    s.fire();
    const k = loop.kick();
    expect(passes).toBe(1);
    const first = release;
    gate = new Promise<void>((r) => (release = r));
    first();
    await new Promise((r) => setTimeout(r, 10));
    expect(passes).toBe(2);
    release();
    await k;
    expect(passes).toBe(2);
    expect(most).toBe(1);
    loop.stop();
  });

  it('a failed pass is logged and the loop goes on; stop unsubscribes and later kicks do nothing', async () => {
    let passes = 0;
    const warned: string[] = [];
    const log = { ...silentLogger, warn: (_o: unknown, msg: string) => warned.push(msg) } as unknown as typeof silentLogger;
    const loop = new ReconcileLoop(async () => {
      passes++;
      if (passes === 1) throw new Error('boom');
    }, { what: 'session pool', log, intervalMs: 60_000 });
    const s = source();
    loop.start([s.on]);
    await loop.kick(); // the start's pass (it throws), then the one this kick asked for
    expect(warned).toEqual(['session pool reconcile failed']);
    expect(passes).toBe(2);
    expect(s.count).toBe(1);
    loop.stop();
    expect(s.count).toBe(0);
    expect(loop.stopped).toBe(true);
    await loop.kick();
    s.fire();
    expect(passes).toBe(2);
  });
});
