import { existsSync, mkdirSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { findEngineBinaries, type EngineName } from '../../../../../src/runtime/local/engines.ts';
import { RunDir, sandboxId } from '../../../../../src/runtime/local/runs/run-dir.ts';
import { SANDBOX_UID, SandboxHost } from '../../../../../src/runtime/local/sandbox.ts';
import { RUNNER_PATH } from '../../../../../src/sandbox/paths.ts';

function host(engine: EngineName): { host: SandboxHost; runsDir: string } {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const root = mkdtempSync(path.join('/tmp/sandpod-test', 'rundir-'));
  const runsDir = path.join(root, 'runs');
  mkdirSync(runsDir);
  const bins = findEngineBinaries({ container_runtime: 'runsc' });
  return { host: new SandboxHost({ engine, bins, root: path.join(root, engine), runnerSource: RUNNER_PATH, seccomp: false, gvisorPlatform: 'systrap', extraRo: [] }, null), runsDir };
}

describe('sandboxId', () => {
  it('is unique and safe as a runsc id, cgroup and directory name', () => {
    const ids = new Set(Array.from({ length: 50 }, () => sandboxId('deps', 1_700_000_000_000)));
    expect(ids.size).toBe(50);
    for (const id of [...ids, sandboxId(null, 1)]) expect(id).toMatch(/^sp-[a-z0-9-]+$/);
  });
});

describe('RunDir', () => {
  it('writes the program and mounts /code and /input read-only, /output writable, /tmp as a tmpfs', () => {
    const { host: h, runsDir } = host('bubblewrap');
    const rd = RunDir.create({ host: h, runsDir, id: 'sp-t1', program: { code: 'print(1)\n', inputJson: '{"x":1}' }, tmpBytes: 1024 });
    expect(readFileSync(path.join(rd.dir, 'code', 'main.py'), 'utf8')).toBe('print(1)\n');
    expect(readFileSync(path.join(rd.dir, 'input', 'data.json'), 'utf8')).toBe('{"x":1}');
    expect(rd.mounts).toEqual([
      { type: 'ro', src: path.join(rd.dir, 'code'), dest: '/code' },
      { type: 'ro', src: path.join(rd.dir, 'input'), dest: '/input' },
      { type: 'rw', src: rd.outputDir, dest: '/output' },
      { type: 'tmpfs', dest: '/tmp', sizeBytes: 1024 },
    ]);
    if (process.getuid?.() === 0) expect(statSync(rd.outputDir).uid).toBe(SANDBOX_UID);
    expect(rd.at('/code/main.py')).toBe('/code/main.py');
    rd.remove();
    expect(existsSync(rd.dir)).toBe(false);
  });

  it('gives the process engine a private tmp/ and host paths, and an install sandbox no program', () => {
    const { host: h, runsDir } = host('process');
    const rd = RunDir.create({ host: h, runsDir, id: 'sp-t2', tmpBytes: 1024 });
    expect(rd.mounts).toEqual([{ type: 'rw', src: path.join(rd.dir, 'tmp'), dest: '/tmp' }]);
    expect(existsSync(path.join(rd.dir, 'code'))).toBe(false);
    rd.mount({ type: 'rw', src: '/somewhere/target', dest: '/deps-build' });
    expect(rd.at('/deps-build/x')).toBe('/somewhere/target/x');
    expect(rd.at('/tmp')).toBe(path.join(rd.dir, 'tmp'));
  });

  it("refuses an id in use without touching that run's directory", () => {
    const { host: h, runsDir } = host('bubblewrap');
    const first = RunDir.create({ host: h, runsDir, id: 'sp-t3', program: { code: 'first', inputJson: '{}' }, tmpBytes: 1 });
    expect(() => RunDir.create({ host: h, runsDir, id: 'sp-t3', program: { code: 'second', inputJson: '{}' }, tmpBytes: 1 })).toThrow(/EEXIST/);
    expect(readFileSync(path.join(first.dir, 'code', 'main.py'), 'utf8')).toBe('first');
  });
});
