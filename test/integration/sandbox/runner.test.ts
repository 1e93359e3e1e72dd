/**
 * runner.py on its own (the same file every runtime runs), driven directly with the system Python:
 * exit-code conventions, CPython-identical tracebacks, SystemExit, the timeout, the clean environment.
 */
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RUNNER_PATH } from '../../../src/sandbox/paths.ts';
import { RUNNER_NOT_DELIVERED_EXIT } from '../../../src/runtime/run-output.ts';
import { UDS_ECHO } from '../../support/uds-echo.ts';

const PY = '/usr/bin/python3';
const CLEAN = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', TMPDIR: '/tmp', LANG: 'C.UTF-8' };

function runRunner(code: string, args: string[] = [], env: Record<string, string> = CLEAN) {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'runner-'));
  mkdirSync(path.join(dir, 'out'));
  const main = path.join(dir, 'main.py');
  writeFileSync(main, code);
  const r = spawnSync(PY, [RUNNER_PATH, '--code', main, '--output', path.join(dir, 'out'), '--cwd', dir, ...args], { env, encoding: 'utf8', timeout: 20_000 });
  const read = (n: string) => {
    try {
      return readFileSync(path.join(dir, 'out', n), 'utf8');
    } catch {
      return null;
    }
  };
  const report = read('.svc_report.json');
  return { status: r.status, runnerStdout: r.stdout, runnerStderr: r.stderr, stdout: read('.svc_stdout'), stderr: read('.svc_stderr'), phase: read('.svc_phase'), report: report ? JSON.parse(report) : null, main, dir };
}

function cpython(main: string, dir: string) {
  return spawnSync(PY, [main], { env: CLEAN, encoding: 'utf8', cwd: dir });
}

/**
 * A runner held as a local pool sandbox is (`--wait --prompt-exit` and `extra`), given `code`, an
 * empty go line, and waited for until its `done` line; it is not ended (it stays after done).
 */
async function heldRunner(prefix: string, code: string, extra: string[]) {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const dir = mkdtempSync(path.join('/tmp/sandpod-test', prefix));
  mkdirSync(path.join(dir, 'out'));
  const main = path.join(dir, 'main.py');
  writeFileSync(main, code);
  const child = spawn(PY, [RUNNER_PATH, '--code', main, '--output', path.join(dir, 'out'), '--cwd', dir, '--phase-fd', '1', '--wait', '--prompt-exit', ...extra], { env: CLEAN, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = Buffer.alloc(0);
  child.stdout.on('data', (b: Buffer) => (out = Buffer.concat([out, b])));
  const exited = new Promise<[number | null, string | null]>((r) => child.on('close', (c, sig) => r([c, sig])));
  const text = () => out.toString('utf8');
  const until = async (pred: () => boolean) => {
    for (let i = 0; i < 400 && !pred(); i++) await new Promise((r) => setTimeout(r, 25));
  };
  await until(() => text().includes('ready\n'));
  child.stdin.end('{}\n');
  await until(() => /(^|\n)done \d+.*\n$/.test(text()));
  return { dir, child, exited, text };
}

describe('runner.py', () => {
  it('exits with the program exit code and writes phase, streams and report', () => {
    const r = runRunner('import sys\nprint("out")\nprint("err", file=sys.stderr)\nsys.exit(7)\n', ['--phase-fd', '1']);
    expect(r.status).toBe(7);
    expect(r.runnerStdout).toBe('execution\n');
    expect(r.stdout).toBe('out\n');
    expect(r.stderr).toBe('err\n');
    expect(r.phase).toBe('failed');
    expect(r.report).toMatchObject({ exit_code: 7, signal: null, timed_out: false, exception: null });
    expect(r.report.execution_ms).toBeGreaterThanOrEqual(0);
    expect(r.report.max_rss_kb).toBeGreaterThan(1000);
  });

  it('--exec runs the program in its own process: its streams after the marker, its exit status, a report only for an exception', () => {
    const ok = runRunner('import os, sys\nprint("out")\nprint("err", file=sys.stderr)\nprint(os.getppid() == PARENT)\nsys.exit(7)\n'.replace('PARENT', String(process.pid)), ['--phase-fd', '1', '--exec']);
    expect(ok.status).toBe(7);
    // The program's parent is whoever started the runner: there is no forked child.
    expect(ok.runnerStdout).toBe('execution\nout\nTrue\n');
    expect(ok.runnerStderr).toBe('err\n');
    expect([ok.stdout, ok.stderr, ok.report, ok.phase]).toEqual([null, null, null, 'execution']);
    const code = 'import json\n\ndef f(d):\n    return d["missing"]\n\nf({})\n';
    const r = runRunner(code, ['--exec']);
    const c = cpython(r.main, r.dir);
    expect(r.status).toBe(1);
    expect(r.runnerStderr).toBe(c.stderr);
    expect(r.report).toMatchObject({ phase: 'failed', exit_code: 1, exception: 'KeyError', exception_mro: ['KeyError', 'LookupError', 'Exception', 'BaseException', 'object'] });
    expect(runRunner('import os\nos.kill(os.getpid(), 9)\n', ['--exec']).status).toBe(null);
  });

  it('closes every fd its launcher leaked: the program sees none of them, nor the phase fd', () => {
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'runner-fds-'));
    const marker = path.join(dir, 'leak-marker');
    writeFileSync(marker, 'secret');
    const main = path.join(dir, 'main.py');
    writeFileSync(main, 'import os\nfor n in sorted(os.listdir("/proc/self/fd"), key=int):\n    try:\n        print(n, os.readlink("/proc/self/fd/" + n))\n    except OSError:\n        pass\n');
    mkdirSync(path.join(dir, 'out'));
    const m = openSync(marker, 'r');
    try {
      for (const mode of [[], ['--exec']]) {
        // fds 3 and 30 hold the marker (inherited, not close-on-exec), fd 31 is the phase pipe.
        const stdio: ('ignore' | 'pipe' | number)[] = ['ignore', 'pipe', 'pipe', m];
        while (stdio.length < 32) stdio.push('ignore');
        stdio[30] = m;
        stdio[31] = 'pipe';
        const r = spawnSync(PY, [RUNNER_PATH, '--code', main, '--output', path.join(dir, 'out'), '--cwd', dir, '--phase-fd', '31', ...mode], { env: CLEAN, encoding: 'utf8', stdio, timeout: 20_000 });
        expect(r.status).toBe(0);
        expect(r.output[31]).toBe('execution\n');
        const listing = mode.length ? r.stdout : readFileSync(path.join(dir, 'out', '.svc_stdout'), 'utf8');
        const fds = Object.fromEntries([...listing.matchAll(/^(\d+) (.*)$/gm)].map((x) => [Number(x[1]), x[2]]));
        expect(Object.keys(fds).length).toBeGreaterThanOrEqual(3);
        expect(Object.values(fds).filter((l) => l!.includes('leak-marker'))).toEqual([]);
        expect([fds[3], fds[30], fds[31]]).toEqual([undefined, undefined, undefined]);
      }
    } finally {
      closeSync(m);
    }
  });

  it('prints tracebacks exactly as CPython does and names the exception', () => {
    const code = 'import json\n\ndef f(d):\n    return d["missing"]\n\nf({})\n';
    const r = runRunner(code);
    const c = cpython(r.main, r.dir);
    expect(r.status).toBe(1);
    expect(c.status).toBe(1);
    expect(r.stderr).toBe(c.stderr);
    expect(r.report).toMatchObject({ exception: 'KeyError', exit_code: 1 });
    const syn = runRunner('def f(:\n  pass\n');
    expect(syn.stderr).toBe(cpython(syn.main, syn.dir).stderr);
    expect(syn.report.exception).toBe('SyntaxError');
  });

  it('follows SystemExit semantics (message to stderr, None is 0)', () => {
    const m = runRunner('raise SystemExit("bye")\n');
    expect(m.status).toBe(1);
    expect(m.stderr).toBe('bye\n');
    expect(runRunner('import sys\nsys.exit(None)\n').status).toBe(0);
    expect(runRunner('import sys\nsys.exit(300)\n').status).toBe(300 & 0xff);
  });

  it("ends the program as CPython's exit does: threads joined, atexit, finalizers, unclosed files flushed", () => {
    const code = [
      'import atexit, sys, threading, time',
      "f = open('unclosed.txt', 'w')",
      "f.write('flushed at exit')",
      'class D:',
      '    def __del__(self):',
      "        print('del ran')",
      'd = D()',
      "atexit.register(lambda: print('atexit ran'))",
      'def later():',
      '    time.sleep(0.2)',
      "    print('thread ran')",
      'threading.Thread(target=later).start()',
      "print('main done')",
      'sys.exit(3)',
      '',
    ].join('\n');
    const r = runRunner(code);
    const unclosed = readFileSync(path.join(r.dir, 'unclosed.txt'), 'utf8');
    const c = cpython(r.main, r.dir);
    expect(c.stdout).toBe('main done\nthread ran\natexit ran\ndel ran\n');
    expect(r.stdout).toBe(c.stdout);
    expect(r.status).toBe(c.status);
    expect(unclosed).toBe('flushed at exit');
    expect(readFileSync(path.join(r.dir, 'unclosed.txt'), 'utf8')).toBe('flushed at exit');
  });

  it('sets argv, path[0] and __main__ like `python PATH`', () => {
    const code = 'import sys, os\nprint(sys.argv == [__file__], sys.path[0] == os.path.dirname(__file__), __name__, __spec__)\n';
    const r = runRunner(code);
    expect(r.stdout).toBe('True True __main__ None\n');
  });

  it('reports a signal death as 128+N', () => {
    const r = runRunner('import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n');
    expect(r.status).toBe(139);
    expect(r.report).toMatchObject({ signal: 11, exit_code: null });
  });

  it('kills the whole process group on timeout and exits 124', () => {
    const t0 = Date.now();
    const r = runRunner('import subprocess, time\nsubprocess.Popen(["sleep", "60"])\nprint("started", flush=True)\nwhile True: time.sleep(1)\n', ['--timeout', '1']);
    expect(r.status).toBe(124);
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(r.phase).toBe('execution');
    expect(r.report).toMatchObject({ timed_out: true, signal: 9 });
    expect(r.stdout).toBe('started\n');
  });

  it('re-executes with a clean environment when it inherited more', () => {
    const r = runRunner("import os\nprint(sorted(os.environ))\nprint('KUBERNETES' in open(f'/proc/{os.getppid()}/environ').read())\n", ['--env', 'A=1'], { ...CLEAN, KUBERNETES_SERVICE_HOST: '10.0.0.1' });
    expect(r.stdout).toBe("['A', 'HOME', 'LANG', 'PATH', 'TMPDIR']\nFalse\n");
  });

  it('applies rlimits to the program', () => {
    const r = runRunner("with open('big', 'wb', buffering=0) as f:\n    for _ in range(10):\n        f.write(b'x' * 500)\n", ['--rlimit', 'fsize=1000']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('File too large');
  });

  it.skipIf(process.getuid?.() !== 0)('is out of the reach of the program it forked (not dumpable), which is dumpable itself', () => {
    // As uid 1000 (root's CAP_SYS_PTRACE would open anything): the program may read its own memory,
    // not the runner's.
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'runner-'));
    mkdirSync(path.join(dir, 'out'));
    chmodSync(dir, 0o755);
    chmodSync(path.join(dir, 'out'), 0o777);
    const main = path.join(dir, 'main.py');
    writeFileSync(main, `
import ctypes, os
def try_open(pid):
    try:
        os.close(os.open('/proc/%d/mem' % pid, os.O_RDWR))
        return 'ok'
    except OSError as e:
        return e.errno
print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), try_open(os.getpid()), try_open(os.getppid()))
`);
    const r = spawnSync('setpriv', ['--reuid=1000', '--regid=1000', '--clear-groups', PY, RUNNER_PATH, '--code', main, '--output', path.join(dir, 'out'), '--cwd', dir], { env: CLEAN, encoding: 'utf8', timeout: 20_000 });
    expect(r.status).toBe(0);
    // PR_GET_DUMPABLE 1 for the program; its own mem opens; the runner's is EACCES.
    expect(readFileSync(path.join(dir, 'out', '.svc_stdout'), 'utf8')).toBe('1 ok 13\n');
  });

  it('--wait: says ready, runs the program the go line names options for, with /dev/null as stdin, and ends with done N', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'runner-wait-'));
    mkdirSync(path.join(dir, 'out'));
    const main = path.join(dir, 'main.py');
    const child = spawn(PY, [RUNNER_PATH, '--code', main, '--output', path.join(dir, 'out'), '--cwd', dir, '--phase-fd', '1', '--timeout', '30', '--wait'], { env: CLEAN, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
    const until = async (pred: () => boolean) => {
      for (let i = 0; i < 400 && !pred(); i++) await new Promise((r) => setTimeout(r, 25));
    };
    await until(() => out.includes('ready\n'));
    expect(out).toBe('ready\n');
    // The program exists only now, after ready: as a warm sandbox's host writes it at claim.
    writeFileSync(main, 'import os, sys, time\nprint(repr(sys.stdin.read()), os.read(0, 10), flush=True)\ntime.sleep(5)\n');
    // The go line, and more behind it that the program must never see.
    child.stdin.write('{"timeout": 1, "max_stream_bytes": 4}\nsecret after the go line\n');
    const code = await exited;
    expect(out).toBe('ready\nexecution\ndone 124\n');
    expect(code).toBe(124);
    // The go line's timeout (1 s, not 30) and stream cap (4 bytes) applied; stdin was empty.
    const report = JSON.parse(readFileSync(path.join(dir, 'out', '.svc_report.json'), 'utf8')) as Record<string, unknown>;
    expect(report).toMatchObject({ timed_out: true, stdout_truncated: true });
    expect(readFileSync(path.join(dir, 'out', '.svc_stdout'), 'utf8')).toBe("'' b");
  });

  it('--wait: a go line carrying the program and its input writes them to --code and --input before the program starts', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'runner-go-'));
    mkdirSync(path.join(dir, 'out'));
    mkdirSync(path.join(dir, 'code'));
    mkdirSync(path.join(dir, 'input'));
    const main = path.join(dir, 'code', 'main.py');
    const input = path.join(dir, 'input', 'data.json');
    const child = spawn(PY, [RUNNER_PATH, '--code', main, '--input', input, '--output', path.join(dir, 'out'), '--cwd', dir, '--phase-fd', '1', '--wait'], { env: CLEAN, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
    for (let i = 0; i < 400 && !out.includes('ready\n'); i++) await new Promise((r) => setTimeout(r, 25));
    // Bigger than the old 4 KiB cap of the line, and not ASCII.
    const code = `import json, sys\nd = json.load(open(${JSON.stringify(input)}))\nprint(d["k"], len(sys.argv[0]) > 0)\nsys.exit(3)\n# ${'é'.repeat(5000)}\n`;
    child.stdin.write(JSON.stringify({ code, input: JSON.stringify({ k: 'wörld' }) }) + '\n');
    expect(await exited).toBe(3);
    expect(out).toBe('ready\nexecution\ndone 3\n');
    expect(readFileSync(main, 'utf8')).toBe(code);
    expect(readFileSync(path.join(dir, 'out', '.svc_stdout'), 'utf8')).toBe('wörld True\n');
  });

  it('--wait: a go line whose code is not a string is refused and nothing runs', () => {
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'runner-go-bad-'));
    mkdirSync(path.join(dir, 'out'));
    const r = spawnSync(PY, [RUNNER_PATH, '--code', path.join(dir, 'main.py'), '--output', path.join(dir, 'out'), '--phase-fd', '1', '--wait'], { env: CLEAN, encoding: 'utf8', input: '{"code": 5}\n', timeout: 20_000 });
    expect(r.status).toBe(125);
    expect(r.stdout).toBe('ready\n');
    expect(() => readFileSync(path.join(dir, 'main.py'))).toThrow();
  });

  it('--wait: EOF before a go line ends the runner with 123 (not delivered) without running anything', () => {
    const r = runRunner('open("ran", "w").write("x")\n', ['--phase-fd', '1', '--wait']);
    expect(r.status).toBe(RUNNER_NOT_DELIVERED_EXIT);
    expect(r.runnerStdout).toBe('ready\n');
    expect(r.phase).toBeNull();
    expect(() => readFileSync(path.join(r.dir, 'ran'))).toThrow();
  });

  it('--prompt-exit: the status comes from the program process’s exit notice; its streams and exception in full, no rusage', () => {
    const ok = runRunner('import sys\nprint("out")\nprint("err", file=sys.stderr)\nsys.exit(7)\n', ['--phase-fd', '1', '--prompt-exit']);
    expect(ok.status).toBe(7);
    expect([ok.stdout, ok.stderr, ok.phase]).toEqual(['out\n', 'err\n', 'failed']);
    // The host measures memory and CPU itself when it asks for this.
    expect(ok.report).toMatchObject({ exit_code: 7, signal: null, max_rss_kb: null, cpu_time_ms: null });
    const code = 'def f(d):\n    return d["missing"]\n\nf({})\n';
    const r = runRunner(code, ['--prompt-exit']);
    expect(r.status).toBe(1);
    expect(r.stderr).toBe(cpython(r.main, r.dir).stderr);
    expect(r.report).toMatchObject({ exit_code: 1, exception: 'KeyError', exception_message: "'missing'" });
    // A signal death sends no notice: its status comes from wait4 as always.
    expect(runRunner('import os\nos.kill(os.getpid(), 9)\n', ['--prompt-exit']).report).toMatchObject({ exit_code: null, signal: 9 });
  });

  it('--prompt-exit: a program that sends an exit notice itself and goes on is killed there, with the status it gave', async () => {
    // It finds the info pipe (its one fd beyond stdio), writes a notice, closes its streams and sleeps.
    const code = [
      'import os, time',
      'open("pid", "w").write(str(os.getpid()))',
      'def pipe(n):',
      '    try:',
      '        return os.readlink("/proc/self/fd/%d" % n).startswith("pipe:")',
      '    except OSError:',
      '        return False',
      'fd = [n for n in range(3, 64) if pipe(n)][0]',
      'print("before", flush=True)',
      'os.write(fd, b"\\x1e5")',
      'for n in (0, 1, 2, fd):',
      '    os.close(n)',
      'time.sleep(30)',
      '',
    ].join('\n');
    const r = runRunner(code, ['--prompt-exit']);
    expect(r.status).toBe(5);
    expect(r.stdout).toBe('before\n');
    const pid = Number(readFileSync(path.join(r.dir, 'pid'), 'utf8'));
    // Killed, not left sleeping (it would sleep 30 s): gone, or a zombie waiting for its new parent
    // to reap it, once the SIGKILL the runner sent has been acted on.
    const state = () => {
      try {
        return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.slice(0, 1);
      } catch {
        return 'gone';
      }
    };
    for (let i = 0; i < 100 && !['gone', 'Z'].includes(state()); i++) await new Promise((r) => setTimeout(r, 20));
    expect(['gone', 'Z']).toContain(state());
  });

  it('--wait --prompt-exit: the program and its group are stopped, not killed, and the runner stays after done until it is killed', async () => {
    // A background process of the same group keeps stdout open: the run still ends at the
    // program's exit, with everything it printed.
    const r = await heldRunner('runner-held-', 'import os, subprocess\nopen("pids", "w").write("%d %d" % (os.getpid(), subprocess.Popen(["sleep", "30"]).pid))\nprint("bye")\n', []);
    expect(r.text()).toBe('ready\nexecution\ndone 0\n');
    expect(readFileSync(path.join(r.dir, 'out', '.svc_stdout'), 'utf8')).toBe('bye\n');
    const state = (pid: number) => readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.slice(0, 1);
    const [program, sleeper] = readFileSync(path.join(r.dir, 'pids'), 'utf8').split(' ').map(Number) as [number, number];
    expect([state(program), state(sleeper)]).toEqual(['T', 'T']);
    // Still there a while later: the host removes the sandbox.
    await new Promise((res) => setTimeout(res, 300));
    expect(r.child.exitCode).toBeNull();
    r.child.kill('SIGKILL');
    for (const pid of [program, sleeper]) process.kill(pid, 'SIGKILL');
    expect(await r.exited).toEqual([null, 'SIGKILL']);
  });

  it('--wait --prompt-exit --stream-frames: the report rides on the done line and the streams on the frames; no control file is written', async () => {
    const r = await heldRunner('runner-inline-', 'import sys\nprint("out")\nprint("érr", file=sys.stderr)\nraise KeyError("k")\n', ['--warm-up', '--stream-frames']);
    r.child.kill('SIGKILL');
    await r.exited;
    const text = r.text();
    const done = /\ndone (\d+) (\{.*\})\n$/.exec(text)!;
    expect(done[1]).toBe('1');
    expect(JSON.parse(done[2]!)).toMatchObject({ phase: 'failed', exit_code: 1, exception: 'KeyError', exception_message: "'k'", max_rss_kb: null, stdout_truncated: false });
    // The frames: stdout, then stderr (its traceback too).
    expect(text).toContain('o 4\nout\n');
    expect(text).toMatch(/e \d+\nérr\n/);
    expect(readdirSync(path.join(r.dir, 'out')).sort()).toEqual(['.svc_phase']);
  });

  it('fails with 125 on a bad argument', () => {
    expect(runRunner('print(1)', ['--bogus']).status).toBe(125);
  });

  it('--egress-proxy relays the proxy port it names in the environment to the Unix socket', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const sock = path.join(mkdtempSync(path.join('/tmp/sandpod-test', 'uds-')), 'proxy.sock');
    // A stand-in for the service's proxy (a separate process: the runner is driven synchronously).
    const server = spawn(PY, ['-c', UDS_ECHO, sock], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => server.stdout!.once('data', () => resolve()));
    try {
      const code = `
import os, urllib.request
print(sorted(k for k in os.environ if 'proxy' in k.lower()))
print(os.environ['HTTP_PROXY'] == os.environ['https_proxy'] == os.environ['ALL_PROXY'])
print(urllib.request.urlopen('http://api.example.test/x?y=1', timeout=10).read().decode())
`;
      const r = runRunner(code, ['--egress-proxy', sock, '--env', 'NO_PROXY=*']);
      expect(r.stderr).toBe('');
      expect(r.status).toBe(0);
      expect(r.stdout).toBe(
        "['ALL_PROXY', 'HTTPS_PROXY', 'HTTP_PROXY', 'all_proxy', 'http_proxy', 'https_proxy']\nTrue\nvia uds: GET http://api.example.test/x?y=1 HTTP/1.1\n",
      );
    } finally {
      server.kill();
    }
    expect(runRunner('print(1)', ['--egress-proxy', sock, '--exec']).status).toBe(125);
  });
});
