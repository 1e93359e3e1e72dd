import { describe, expect, it } from 'vitest';
import { Batcher } from '../../../src/store/batcher.ts';

/** A flush the test releases by hand, recording every batch it was given. */
function gatedFlush() {
  const batches: number[][] = [];
  const gates: (() => void)[] = [];
  const flush = (items: number[]) => {
    batches.push(items);
    return new Promise<number[]>((resolve, reject) => {
      gates.push(() => (items.includes(-1) ? reject(new Error('bad item')) : resolve(items.map((i) => i * 10))));
    });
  };
  return { batches, gates, flush };
}
const tick = () => new Promise((r) => setImmediate(r));

describe('Batcher', () => {
  it('writes items added in one turn as one batch, and collects new ones while that batch is in flight', async () => {
    const f = gatedFlush();
    const b = new Batcher(f.flush);
    const first = [1, 2, 3].map((i) => b.add(i));
    await tick();
    expect(f.batches).toEqual([[1, 2, 3]]);
    const later = [4, 5].map((i) => b.add(i));
    await tick();
    await tick();
    // One flush in flight: 4 and 5 wait for it instead of starting a second, smaller one.
    expect(f.batches).toEqual([[1, 2, 3]]);
    f.gates.shift()!();
    expect(await Promise.all(first)).toEqual([10, 20, 30]);
    await tick();
    expect(f.batches).toEqual([[1, 2, 3], [4, 5]]);
    f.gates.shift()!();
    expect(await Promise.all(later)).toEqual([40, 50]);
  });

  it('splits at maxBatch, and with maxInFlight 2 runs two batches at once', async () => {
    const f = gatedFlush();
    const b = new Batcher(f.flush, 2, 2);
    const all = [1, 2, 3, 4, 5].map((i) => b.add(i));
    await tick();
    await tick();
    expect(f.batches).toEqual([[1, 2], [3, 4]]);
    f.gates.shift()!();
    await tick();
    await tick();
    expect(f.batches).toEqual([[1, 2], [3, 4], [5]]);
    while (f.gates.length) f.gates.shift()!();
    expect(await Promise.all(all)).toEqual([10, 20, 30, 40, 50]);
  });

  it('one bad item fails alone: its neighbours are retried one by one and succeed', async () => {
    const b = new Batcher<number, number>(async (items) => {
      if (items.includes(-1)) throw new Error('bad item');
      return items.map((i) => i * 10);
    });
    const results = await Promise.allSettled([1, -1, 2].map((i) => b.add(i)));
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : (r.reason as Error).message))).toEqual([10, 'bad item', 20]);
  });
});
