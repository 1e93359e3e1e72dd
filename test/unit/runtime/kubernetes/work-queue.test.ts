import { describe, expect, it } from 'vitest';
import { KeyedWorkQueue } from '../../../../src/runtime/kubernetes/runs/work-queue.ts';

const tick = (ms = 0) => new Promise((r) => setTimeout(r, ms));

describe('KeyedWorkQueue', () => {
  it('runs one worker per key at a time and coalesces adds during a run into one rerun', async () => {
    let running = 0;
    let maxRunning = 0;
    const runs: string[] = [];
    let release!: () => void;
    const q = new KeyedWorkQueue(async (key) => {
      running++;
      maxRunning = Math.max(maxRunning, running);
      runs.push(key);
      if (runs.length === 1) await new Promise<void>((r) => (release = r));
      running--;
    });
    q.add('a');
    await tick();
    q.add('a');
    q.add('a');
    q.add('a');
    release();
    await tick(10);
    expect(runs).toEqual(['a', 'a']);
    expect(maxRunning).toBe(1);
  });

  it('keys are independent', async () => {
    const seen: string[] = [];
    const q = new KeyedWorkQueue(async (key) => {
      seen.push(key);
    });
    q.add('a');
    q.add('b');
    await tick(5);
    expect(seen.sort()).toEqual(['a', 'b']);
  });

  it('retries a failing worker with capped backoff', async () => {
    const at: number[] = [];
    const errors: number[] = [];
    const q = new KeyedWorkQueue(
      async () => {
        at.push(Date.now());
        if (at.length < 4) throw new Error('boom');
      },
      { backoffInitialMs: 10, backoffMaxMs: 20, onError: (_k, _e, ms) => errors.push(ms) },
    );
    q.add('k');
    await tick(150);
    expect(at).toHaveLength(4);
    expect(errors).toEqual([10, 20, 20]);
    q.stop();
  });

  it('addAfter keeps the earliest wake-up and forget cancels it', async () => {
    const seen: number[] = [];
    const q = new KeyedWorkQueue(async () => {
      seen.push(Date.now());
    });
    q.addAfter('k', 200);
    q.addAfter('k', 10);
    await tick(50);
    expect(seen).toHaveLength(1);
    q.addAfter('k', 20);
    q.forget('k');
    await tick(60);
    expect(seen).toHaveLength(1);
  });
});
