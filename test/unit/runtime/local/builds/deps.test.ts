import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { DepsCache, depsKey, invalidRequirement, normalizeRequirements, type Installer } from '../../../../../src/runtime/local/builds/deps.ts';

function root(): string {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  return mkdtempSync(path.join('/tmp/sandpod-test', 'deps-'));
}

describe('requirement keys', () => {
  it('normalizes order and duplicates, so the cache key is order-insensitive', () => {
    expect(normalizeRequirements([' b ', 'a', 'b', ''])).toEqual(['a', 'b']);
    const k = (r: string[]) => depsKey('/usr/bin/python3', '3.11', normalizeRequirements(r), { no_index: true });
    expect(k(['x', 'y'])).toBe(k(['y', 'x', 'x']));
    expect(k(['x'])).not.toBe(k(['x==2']));
    expect(depsKey('/usr/bin/python3', '3.11', ['x'], { no_index: false })).not.toBe(depsKey('/usr/bin/python3', '3.11', ['x'], { no_index: true }));
  });
  it('refuses requirements that pip would take for options', () => {
    expect(invalidRequirement(['requests', '-r/etc/shadow'])).toMatch(/pip option/);
    expect(invalidRequirement(['a\nb'])).toMatch(/control character/);
    expect(invalidRequirement(['numpy>=1.0'])).toBeNull();
  });
});

describe('DepsCache', () => {
  const writer = (calls: string[], ok = true, delayMs = 20): Installer => async (target, reqs) => {
    calls.push(reqs.join(','));
    await new Promise((r) => setTimeout(r, delayMs));
    writeFileSync(path.join(target, 'marker'), reqs.join(','));
    return { ok, output: ok ? '' : 'ERROR: nope', timedOut: false, cancelled: false };
  };

  it('installs once for concurrent callers and publishes atomically', async () => {
    const cache = new DepsCache(root(), () => {});
    const calls: string[] = [];
    const far = Date.now() + 10_000;
    const rs = await Promise.all([1, 2, 3].map(() => cache.ensure('k1', ['a'], writer(calls), far)));
    expect(calls).toEqual(['a']);
    for (const r of rs) expect(r.kind).toBe('ready');
    const dir = (rs[0] as { dir: string }).dir;
    expect(readFileSync(path.join(dir, 'marker'), 'utf8')).toBe('a');
    const again = await cache.ensure('k1', ['a'], writer(calls), far);
    expect(again).toMatchObject({ kind: 'ready', dir });
    expect(again.installMs).toBeLessThan(20);
    expect(calls).toEqual(['a']);
  });

  it("passes pip's failure on and publishes nothing", async () => {
    const cache = new DepsCache(root(), () => {});
    const calls: string[] = [];
    const r = await cache.ensure('k2', ['bad'], writer(calls, false), Date.now() + 10_000);
    expect(r).toMatchObject({ kind: 'failed', message: 'ERROR: nope' });
    const r2 = await cache.ensure('k2', ['bad'], writer(calls, false), Date.now() + 10_000);
    expect(r2.kind).toBe('failed');
    expect(calls).toHaveLength(2);
  });

  it("a waiter gives up at its own deadline", async () => {
    const cache = new DepsCache(root(), () => {});
    const calls: string[] = [];
    const slow = cache.ensure('k3', ['s'], writer(calls, true, 500), Date.now() + 10_000);
    const waiter = await cache.ensure('k3', ['s'], writer(calls, true, 500), Date.now() + 50);
    expect(waiter.kind).toBe('timeout');
    expect((await slow).kind).toBe('ready');
  });
});
