/**
 * The sandbox command's parts that keep the program's neighbours out of its reach (issue #9); the
 * behaviour itself is proven against real engines in test/integration/sandbox/reach.test.ts.
 */
import { mkdirSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { findEngineBinaries, type EngineName } from '../../../../src/runtime/local/engines.ts';
import { SandboxHost, type SandboxSpec } from '../../../../src/runtime/local/sandbox.ts';
import { RUNNER_PATH } from '../../../../src/sandbox/paths.ts';

function host(engine: EngineName): { host: SandboxHost; root: string } {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const root = mkdtempSync(path.join('/tmp/sandpod-test', 'sbx-'));
  const bins = findEngineBinaries({ container_runtime: 'runsc' });
  return { host: new SandboxHost({ engine, bins: { ...bins, bwrap: bins.bwrap ?? 'bwrap' }, root, runnerSource: RUNNER_PATH, seccomp: false, gvisorPlatform: 'systrap', extraRo: [] }, null), root };
}

function spec(dir: string): SandboxSpec {
  return { id: 'sp-x', dir, argv: ['/usr/bin/python3', '/runner/runner.py'], env: {}, cwd: '/tmp', mounts: [], network: false, rlimits: { nofile: 64 }, procsFiles: [] };
}

describe('SandboxHost on bubblewrap', () => {
  it('starts the command as PID 1: no bwrap init (unfiltered, dumpable) lives in the sandbox', () => {
    const { host: h, root } = host('bubblewrap');
    const args = h.launch(spec(root), true).args;
    expect(args.indexOf('--as-pid-1')).toBeGreaterThan(args.indexOf('--unshare-pid'));
    expect(args.indexOf('--as-pid-1')).toBeLessThan(args.indexOf('--'));
  });

  it('offers an execute-only copy of sh as the waiting shell, so that process is not dumpable', () => {
    const { host: h, root } = host('bubblewrap');
    expect(h.waitingShell()).toBe('/runner/sh');
    const copy = path.join(root, 'runner', 'sh');
    expect(statSync(copy).mode & 0o7777).toBe(0o111);
    const sh = findEngineBinaries({ container_runtime: 'runsc' }).sh;
    expect(statSync(copy).size).toBe(statSync(sh).size);
    expect(readFileSync(copy).subarray(0, 4).toString('latin1')).toBe('\x7fELF');
  });
});

describe('SandboxHost on other engines', () => {
  it("uses the host's sh (the in-process path is bubblewrap's only)", () => {
    const sh = findEngineBinaries({ container_runtime: 'runsc' }).sh;
    expect(host('gvisor').host.waitingShell()).toBe(sh);
    expect(host('process').host.waitingShell()).toBe(sh);
  });
});
