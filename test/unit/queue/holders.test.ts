/** Who counts as a dead holder of a running record on this host (crash recovery's first test). */
import { spawnSync, spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { describe, expect, it } from 'vitest';
import { holderIsDeadHere } from '../../../src/queue/holders.ts';

function deadPid(): number {
  const r = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))']);
  return Number(r.stdout.toString());
}

describe('holderIsDeadHere', () => {
  it.each([
    { name: 'no holder at all', holder: null, dead: true },
    { name: 'another host (cannot tell: its heartbeat decides)', holder: 'some-other-host/1/abcd', dead: false },
    { name: 'this pid under another nonce (our previous life)', holder: `${hostname()}/${process.pid}/old`, dead: true },
    { name: 'a pid that is not a number', holder: `${hostname()}/x/abcd`, dead: false },
  ])('$name → $dead', ({ holder, dead }) => {
    expect(holderIsDeadHere(holder)).toBe(dead);
  });

  it('a live process of this host is alive; once it exits it is dead', async () => {
    const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 10000)']);
    const holder = `${hostname()}/${child.pid}/n`;
    try {
      expect(holderIsDeadHere(holder)).toBe(false);
    } finally {
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
    }
    expect(holderIsDeadHere(holder)).toBe(true);
    expect(holderIsDeadHere(`${hostname()}/${deadPid()}/n`)).toBe(true);
  });
});
