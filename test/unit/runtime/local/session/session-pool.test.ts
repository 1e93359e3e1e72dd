/**
 * The local session pool's hand-out rules (session-pool.ts), with sandboxes that only record what was
 * done to them (the real ones: test/integration/sandbox/session-pool.test.ts): a session asking for
 * more than its type's requirements never takes one and is not counted; a ready one started as another
 * definition of the type is destroyed, not handed out; one that ends while it waits is dropped and
 * replaced; a failed start backs off; stop destroys ready ones and those still starting.
 */
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../../../../src/config.ts';
import { FileJobTypeRegistry, type JobType } from '../../../../../src/jobtypes/job-type.ts';
import { silentLogger } from '../../../../../src/logger.ts';
import type { SessionEnd } from '../../../../../src/runtime/session.ts';
import { SessionPool } from '../../../../../src/runtime/local/session/session-pool.ts';
import type { LocalSessionSandbox } from '../../../../../src/runtime/local/session/session-sandbox.ts';

const base = new FileJobTypeRegistry(parseConfig({}, {})).get('default')!;

class Fake {
  warm = false;
  ended: SessionEnd | null = null;
  destroyed = false;
  private readonly listeners: ((e: SessionEnd) => void)[] = [];
  constructor(readonly n: number) {}
  onEnd(cb: (e: SessionEnd) => void) {
    this.listeners.push(cb);
  }
  die() {
    this.ended = { reason: 'crashed', detail: 'killed' };
    for (const l of this.listeners) l(this.ended);
  }
  async destroy() {
    this.destroyed = true;
  }
}

function pool(o: { fail?: () => boolean; hold?: Promise<void> } = {}) {
  let now = 1_000_000;
  const started: Fake[] = [];
  const p = new SessionPool({
    sizes: { default: 1 },
    jobType: (name) => (name === 'default' ? base : undefined),
    idleMs: 300_000,
    start: async (_jt: JobType) => {
      await o.hold;
      if (o.fail?.()) throw new Error('no');
      const f = new Fake(started.length + 1);
      started.push(f);
      return f as unknown as LocalSessionSandbox;
    },
    now: () => now,
    log: silentLogger,
    tickMs: 60_000,
  });
  return { p, started, advance: (ms: number) => (now += ms) };
}

const settle = () => new Promise((r) => setTimeout(r, 20));

describe('SessionPool', () => {
  it('hands the ready one to a session of the type asking for its own requirements, once; then refills', async () => {
    const { p, started } = pool();
    p.tick();
    await settle();
    expect(p.stats()).toEqual([{ job_type: 'default', target: 1, ready: 1, starting: 0, hits: 0, misses: 0 }]);
    const got = p.take(base, [], 32768, 32768) as unknown as Fake;
    expect(got).toBe(started[0]);
    expect(got.warm).toBe(true);
    expect(p.take(base, [], 32768, 32768)).toBeNull();
    expect(p.stats()[0]).toMatchObject({ hits: 1, misses: 1 });
    await settle();
    expect(started).toHaveLength(2);
    expect(p.stats()[0]).toMatchObject({ ready: 1 });
    await p.stop();
    expect(started[1]!.destroyed).toBe(true);
    expect(got.destroyed).toBe(false); // the session's, not the pool's
  });

  it('extra requirements or another stream cap: no sandbox, not counted', async () => {
    const { p } = pool();
    p.tick();
    await settle();
    expect(p.take(base, ['numpy'], 32768, 32768)).toBeNull();
    expect(p.take(base, [], 1024, 32768)).toBeNull();
    expect(p.stats()[0]).toMatchObject({ ready: 1, hits: 0, misses: 0 });
    await p.stop();
  });

  it('a ready one of another definition of the type is destroyed, not handed out', async () => {
    const { p, started } = pool();
    p.tick();
    await settle();
    expect(p.take({ ...base, memoryLimit: '64m' }, [], 32768, 32768)).toBeNull();
    expect(started[0]!.destroyed).toBe(true);
    expect(p.stats()[0]).toMatchObject({ hits: 0, misses: 1 });
    // The pool now starts the type as the session asked for it, and hands that one out.
    await settle();
    expect(p.take({ ...base, memoryLimit: '64m' }, [], 32768, 32768)).toBe(started[1]);
    await p.stop();
  });

  it('one that ends while it waits is dropped and replaced; a failed start backs off', async () => {
    let failing = false;
    const { p, started, advance } = pool({ fail: () => failing });
    p.tick();
    await settle();
    failing = true;
    started[0]!.die();
    expect(started[0]!.destroyed).toBe(true);
    expect(p.stats()[0]).toMatchObject({ ready: 0 });
    await settle();
    expect(p.stats()[0]).toMatchObject({ ready: 0, starting: 0 });
    failing = false;
    p.tick();
    await settle();
    expect(started).toHaveLength(1); // backing off
    advance(1_000);
    p.tick();
    await settle();
    expect(started).toHaveLength(2);
    expect(p.take(base, [], 32768, 32768)).toBe(started[1]);
    await p.stop();
  });

  it('stop destroys one still starting once it is up', async () => {
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    const { p, started } = pool({ hold });
    p.tick();
    const stopped = p.stop();
    release();
    await stopped;
    expect(started).toHaveLength(1);
    expect(started[0]!.destroyed).toBe(true);
    expect(p.take(base, [], 32768, 32768)).toBeNull();
  });
});
