/**
 * Session sandboxes on the local runtime (issue 19), on each real engine, nothing mocked: state
 * persists across cells; a cell past its timeout is interrupted (KeyboardInterrupt) and the state
 * survives; a cell that ignores the interrupt is killed with its session (`crashed`); two sessions
 * see neither each other's variables, files nor processes; /code and /input are read-only, /workspace
 * is the writable working directory; what a cell writes to /output is that cell's artifacts; an OOM
 * kill in the session's cgroup (of the interpreter, or only of a cell's child) ends the session `oom`.
 */
import { mkdtempSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import type { CellSpec, SessionEnd, SessionSandbox } from '../../../src/runtime/session.ts';
import { describeEachEngine } from '../../support/engines.ts';

const asRoot = process.getuid?.() === 0;

describeEachEngine('session sandboxes', (engine) => {
  let rt: LocalRuntime;
  let config: Config;
  const open: SessionSandbox[] = [];
  beforeAll(async () => {
    const workspace = mkdtempSync(path.join('/tmp', 'sandpod-sess-'));
    config = parseConfig({ workspace, sandbox_engine: engine, warm_pool: { sizes: {} } }, {});
    rt = createLocalRuntime(config);
    await rt.start();
  }, 120_000);
  afterAll(async () => {
    for (const s of open) await s.destroy().catch(() => {});
    await rt?.stop();
  });

  const session = async (memoryLimit?: string) => {
    const jt = new FileJobTypeRegistry(config).get('default')!;
    const s = await rt.openSession!(memoryLimit ? { ...jt, memoryLimit } : jt, { maxStreamBytes: 32768, startupMs: 60_000 });
    open.push(s);
    return s;
  };
  let n = 0;
  const cell = (s: SessionSandbox, code: string, over: Partial<CellSpec> = {}) =>
    s.runCell({ cell: ++n, code, inputJson: '{}', timeoutSec: 20, maxStdoutBytes: 32768, maxArtifactBytes: 1 << 20, ...over });

  it.skipIf(!asRoot)('keeps state across cells; a timed-out cell is interrupted and the state survives', async () => {
    const s = await session();
    const a = await cell(s, 'import json\nx = 41\nopen("notes.txt", "w").write("kept")\nprint("one")');
    expect(a.report?.exit_code).toBe(0);
    expect(a.stdout).toBe('one\n');
    const b = await cell(s, 'x += 1\nprint(x, open("notes.txt").read())\nimport os\nprint(os.getcwd())');
    expect(b.stdout).toBe('42 kept\n/workspace\n');
    const t = await cell(s, 'import time\ny = 1\nwhile True: time.sleep(0.05)', { timeoutSec: 1 });
    expect(t.observation.timedOut).toBe('execution');
    expect(t.report?.exception).toBe('KeyboardInterrupt');
    const c = await cell(s, 'import json\nprint(x, y)\njson.dump({"x": x}, open("/output/result.json", "w"))\nopen("/output/a.txt", "w").write("A")');
    expect(c.stdout).toBe('42 1\n');
    expect(c.resultJson).toBe('{"x": 42}');
    expect(c.artifacts.map((f) => f.name)).toEqual(['a.txt']);
    // The next cell's /output starts empty: artifacts belong to the cell that wrote them.
    const d = await cell(s, 'import os\nprint(sorted(os.listdir("/output")))\n1/0');
    expect(d.stdout).toBe('[]\n');
    expect(d.report).toMatchObject({ exit_code: 1, exception: 'ZeroDivisionError' });
    expect(d.stderr).toContain('ZeroDivisionError');
  }, 120_000);

  it.skipIf(!asRoot)('/code and /input are read-only; two sessions share no variables, files or processes', async () => {
    const [s1, s2] = [await session(), await session()];
    await cell(s1, 'secret = "s1"\nopen("/workspace/only-s1", "w").write("1")\nimport subprocess\np = subprocess.Popen(["sleep", "60"])');
    const probe = await cell(
      s2,
      [
        'import os, json',
        'def w(p):',
        '    try:',
        '        open(p, "w").write("x"); return "written"',
        '    except OSError as e: return type(e).__name__',
        'print(json.dumps({"secret": "secret" in globals(), "file": os.path.exists("/workspace/only-s1"),',
        '  "sleep": any(b"sleep" in open("/proc/%s/cmdline" % p, "rb").read() for p in os.listdir("/proc") if p.isdigit()),',
        '  "code": w("/code/x.py"), "input": w("/input/x"), "uid": os.getuid()}))',
      ].join('\n'),
    );
    expect(JSON.parse(probe.stdout)).toEqual({ secret: false, file: false, sleep: false, code: expect.not.stringMatching(/written/), input: expect.not.stringMatching(/written/), uid: 1000 });
  }, 120_000);

  it.skipIf(!asRoot)('a cell that ignores its interrupt is killed and the session ends crashed', async () => {
    const s = await session();
    const ended = new Promise<SessionEnd>((r) => s.onEnd(r));
    const r = await cell(s, 'import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)', { timeoutSec: 1 });
    expect(r.observation.timedOut).toBe('execution');
    expect((await ended).reason).toBe('crashed');
    // A cell that comes after the end ran nothing and says how the sandbox ended: killed, not oom.
    const late = await cell(s, 'print(1)');
    expect(late.observation).toMatchObject({ exitCode: 137, oomKilled: false });
    expect(late.stdout).toBe('');
  }, 120_000);

  const BOMB = 'x = []\nwhile True:\n    x.append(bytearray(32 * 1024 * 1024))\n';

  it.skipIf(!asRoot)('a cell past the memory limit is OOM-killed (137) and the session ends oom', async () => {
    const s = await session('256m');
    const ended = new Promise<SessionEnd>((r) => s.onEnd(r));
    expect((await cell(s, 'kept = 1\nprint("ok")')).stdout).toBe('ok\n');
    const r = await cell(s, BOMB);
    expect(r.observation.exitCode).toBe(137);
    expect(r.observation.oomKilled).toBe(true);
    expect((await ended).reason).toBe('oom');
    const late = await cell(s, 'print(kept)');
    expect(late.observation).toMatchObject({ exitCode: 137, oomKilled: true });
    expect(late.stdout).toBe('');
  }, 120_000);

  it.skipIf(!asRoot)('a child process of a cell OOM-killed: the interpreter survives it, yet the session ends oom', async () => {
    const s = await session('256m');
    const ended = new Promise<SessionEnd>((r) => s.onEnd(r));
    const r = await cell(s, `import subprocess, sys\np = subprocess.run([sys.executable, "-c", ${JSON.stringify(BOMB)}])\nprint("child", p.returncode)`);
    expect(r.observation.oomKilled).toBe(true);
    // bubblewrap: the kernel kills the child and the interpreter goes on; gVisor: the host kills the
    // sandbox's kernel (the sentry, which holds all of its memory), so the cell never prints.
    expect(r.stdout).toBe(engine === 'gvisor' ? '' : 'child -9\n');
    expect((await ended).reason).toBe('oom');
  }, 120_000);
});
