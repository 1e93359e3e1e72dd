/**
 * fds the service inherited without close-on-exec (a CI harness's pipe, a shell redirect): found by
 * reading /proc/self/fdinfo, and covered with /dev/null in every child `spawnProc` starts.
 */
import { spawn } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { coverInheritedFds, scanInheritedFds } from '../../../src/util/inherited-fds.ts';

const ROOT = path.resolve(import.meta.dirname, '../../..');

describe('inherited fds', () => {
  it('coverInheritedFds puts /dev/null at each inherited fd the stdio array does not set, ignore in the gaps', () => {
    expect(coverInheritedFds(['ignore', 'pipe', 'pipe'], 99, [])).toEqual(['ignore', 'pipe', 'pipe']);
    expect(coverInheritedFds(['ignore', 'pipe', 'pipe', 11], 99, [3, 5, 7])).toEqual(['ignore', 'pipe', 'pipe', 11, 'ignore', 99, 'ignore', 99]);
  });

  it('this process (Node opens everything close-on-exec) reports no fd it opened itself', () => {
    const fd = openSync('/etc/hostname', 'r');
    try {
      expect(scanInheritedFds()).not.toContain(fd);
    } finally {
      closeSync(fd);
    }
  });

  it('a process that inherited fds 30 and 41 finds them, and a child spawnProc starts gets neither', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'inherited-fds-'));
    const marker = path.join(dir, 'leak-marker');
    writeFileSync(marker, 'secret');
    const m = openSync(marker, 'r');
    let out = '';
    let err = '';
    const code = await new Promise<number | null>((resolve) => {
      // libuv dup2s `m` to 30 and 41 in the child, which clears close-on-exec: inherited, as from a
      // harness. (Node itself marks low fds close-on-exec at startup, so these are high ones.)
      const stdio: ('ignore' | 'pipe' | number)[] = ['ignore', 'pipe', 'pipe'];
      while (stdio.length < 42) stdio.push('ignore');
      stdio[30] = m;
      stdio[41] = m;
      const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/fd-probe.ts'], { cwd: ROOT, stdio });
      child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
      child.on('close', resolve);
    });
    closeSync(m);
    expect({ code, err }).toEqual({ code: 0, err: '' });
    const probe = JSON.parse(out) as { inherited: number[]; code: number; listing: string };
    expect(probe.inherited).toEqual(expect.arrayContaining([30, 41]));
    expect(probe.code).toBe(0);
    const fds = Object.fromEntries([...probe.listing.matchAll(/ (\d+) -> (.*)$/gm)].map((x) => [Number(x[1]), x[2]]));
    expect(fds[3]).toBe('/etc/hostname');
    expect([fds[30], fds[41]]).toEqual(['/dev/null', '/dev/null']);
    expect(Object.values(fds).filter((l) => l!.includes('leak-marker'))).toEqual([]);
  });
});
