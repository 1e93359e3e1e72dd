import { constants } from 'node:os';
import { describe, expect, it } from 'vitest';
import { systemClock } from '../../../../../src/clock.ts';
import { signalNumber, superviseLaunch, type SuperviseOptions } from '../../../../../src/runtime/local/runs/proc.ts';
import type { Launch } from '../../../../../src/runtime/local/sandbox.ts';

const sh = (script: string): Launch => ({ file: '/bin/sh', args: ['-c', script], env: { PATH: '/usr/bin:/bin' }, fdFiles: [] });
const opts = (over: Partial<SuperviseOptions> = {}): SuperviseOptions => ({
  clock: systemClock,
  startupDeadline: Date.now() + 5000,
  timeoutMs: 5000,
  kill: () => undefined,
  ...over,
});

describe('signalNumber', () => {
  it("takes the platform's numbers (what a shell reports as 128 + n)", () => {
    expect(signalNumber('SIGKILL')).toBe(9);
    expect(signalNumber('SIGSYS')).toBe(constants.signals.SIGSYS);
    expect(signalNumber('SIGWINCH')).toBe(constants.signals.SIGWINCH);
    expect(signalNumber('SIGNOPE')).toBe(0);
  });
});

describe('superviseLaunch', () => {
  it('sees the execution marker, then the exit status', async () => {
    let phases = 0;
    const r = await superviseLaunch(sh('echo execution; exit 3'), opts({ onExecution: () => phases++ }));
    expect(r).toMatchObject({ exitCode: 3, killedBy: null, spawnError: null });
    expect(r.tExec).not.toBeNull();
    expect(phases).toBe(1);
  });

  it('kills the whole group at the execution deadline and reports 128 + SIGKILL', async () => {
    let cgroupKilled = false;
    const t0 = Date.now();
    const r = await superviseLaunch(sh('echo execution; sleep 30 & wait'), opts({ timeoutMs: 100, kill: () => (cgroupKilled = true) }));
    expect(r).toMatchObject({ killedBy: 'deadline', exitCode: 128 + 9, signal: 'SIGKILL' });
    expect(cgroupKilled).toBe(true);
    // Grace is added when the runner keeps the time limit itself.
    expect(Date.now() - t0).toBeGreaterThanOrEqual(100 + 1500 - 50);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });

  it('fires the startup deadline when the marker never comes, and stops on abort', async () => {
    const startup = await superviseLaunch(sh('sleep 30'), opts({ startupDeadline: Date.now() + 100 }));
    expect(startup).toMatchObject({ killedBy: 'deadline', tExec: null });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    const aborted = await superviseLaunch(sh('sleep 30'), opts({ signal: ac.signal }));
    expect(aborted).toMatchObject({ killedBy: 'abort', tExec: null });
  });

  it('keeps stream tails and says why a command could not start', async () => {
    const r = await superviseLaunch(sh('echo out; echo err >&2'), opts({ collectStdout: true }));
    expect(r).toMatchObject({ exitCode: 0, stdoutTail: 'out\n', stderrTail: 'err\n' });
    const missing = await superviseLaunch({ file: '/nonexistent/bin', args: [], env: {}, fdFiles: [] }, opts());
    expect(missing.spawnError).toMatch(/ENOENT/);
  });
});
