/**
 * The local runtime against real sandboxes: the same suite runs on gVisor and on bubblewrap (CI
 * installs both; a missing engine fails the suite when CI=true and is skipped visibly otherwise), and a
 * smaller one on the unisolated `process` engine. Nothing is mocked: runsc, bwrap and python run.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import type { Logger } from '../../../src/logger.ts';
import { FileJobTypeRegistry, type JobType } from '../../../src/jobtypes/job-type.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import { findEngineBinaries, type EngineName } from '../../../src/runtime/local/engines.ts';
import { instanceRoot } from '../../../src/runtime/local/workspace.ts';
import { RunGoneError, type RunSpec } from '../../../src/runtime/runtime.ts';
import { describeEachEngineAndMode, modeConfig, runAs } from '../../support/engines.ts';
import { buildWheels } from '../../support/wheel.ts';

// The service's own secrets: set in this process, must never be visible to a run.
const CANARY = `canary-${process.pid}-${Date.now()}`;
process.env.SVC_DATABASE_URL = `postgres://user:${CANARY}@db/sandpod`;
process.env.SANDPOD_TEST_CANARY = CANARY;

const WHEELS = buildWheels([{ name: 'sandpod-testpkg', version: '1.2.3' }]);

function makeConfig(engine: EngineName, extra: Record<string, unknown> = {}): Config {
  const workspace = mkdtempSync(path.join('/tmp/sandpod-test', `ws-${engine}-`));
  return parseConfig({ workspace, sandbox_engine: engine, pip: { find_links: [WHEELS], no_index: true }, ...extra }, {});
}

function jobType(config: Config, over: Partial<JobType> = {}): JobType {
  return { ...new FileJobTypeRegistry(config).get('default')!, ...over };
}

function spec(config: Config, code: string, over: Partial<RunSpec> & { jt?: Partial<JobType> } = {}): RunSpec {
  const { jt, ...rest } = over;
  return {
    executionId: `t-${Math.random().toString(36).slice(2)}`,
    code,
    inputJson: '{"x": 41}',
    jobType: jobType(config, jt),
    timeoutSec: 20,
    startupTimeoutSec: 60,
    requirements: [],
    maxStdoutBytes: 32768,
    maxArtifactBytes: 1024 * 1024,
    ...rest,
  };
}

/** A TCP server on the host's loopback that counts connections (it must see none from a run). */
async function listen(): Promise<{ port: number; connections: () => number; close: () => Promise<void> }> {
  let n = 0;
  const server = net.createServer((s) => {
    n++;
    s.end('hello\n');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  return { port, connections: () => n, close: () => new Promise((r) => server.close(() => r())) };
}

/** A real (pino) logger whose lines land, parsed, in `logged`. */
function capturingLogger(logged: Record<string, unknown>[]): Logger {
  return pino({ level: 'info' }, { write: (line: string) => void logged.push(JSON.parse(line) as Record<string, unknown>) });
}

/** An HTTP server on the host's loopback that answers `hello <path>` and records the paths. */
async function httpServer(): Promise<{ port: number; paths: () => string[]; close: () => Promise<void> }> {
  const paths: string[] = [];
  const server = http.createServer((req, res) => {
    paths.push(req.url ?? '');
    res.end(`hello ${req.url}`);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  return { port, paths: () => [...paths], close: () => new Promise((r) => server.close(() => r())) };
}

/** Tries every way out of an `allowed_hosts` sandbox; prints what happened as JSON. */
const PY_EGRESS = (port: number, otherPort: number) => `
import http.client, json, os, socket, urllib.error, urllib.request
out = {'proxy': os.environ.get('HTTP_PROXY')}
out['plain'] = urllib.request.urlopen('http://127.0.0.1:${port}/plain?q=1', timeout=10).read().decode()
proxy_port = int(out['proxy'].rsplit(':', 1)[1])
c = http.client.HTTPConnection('127.0.0.1', proxy_port, timeout=10)
c.set_tunnel('127.0.0.1', ${port})
c.request('GET', '/tunnel')
out['tunnel'] = c.getresponse().read().decode()
try:
    urllib.request.urlopen('http://127.0.0.1:${otherPort}/', timeout=10)
    out['other_port'] = 'reached'
except urllib.error.HTTPError as e:
    out['other_port'] = e.code
try:
    urllib.request.urlopen('http://localhost/', timeout=10)
    out['private_name'] = 'reached'
except urllib.error.HTTPError as e:
    out['private_name'] = e.code
    out['private_reason'] = e.read().decode()
try:
    urllib.request.urlopen('https://evil.example.org/', timeout=10)
    out['https_denied'] = 'reached'
except Exception as e:
    out['https_denied'] = str(e)
s = socket.socket()
s.settimeout(3)
try:
    s.connect(('127.0.0.1', ${port}))
    out['direct'] = 'connected'
except OSError:
    out['direct'] = 'blocked'
try:
    socket.getaddrinfo('evil.example.org', 80)
    out['resolv'] = 'resolved'
except OSError:
    out['resolv'] = 'no-dns'
print(json.dumps(out))
`;

const PY_CONNECT = (host: string, port: number) => `
import socket
s = socket.socket()
s.settimeout(3)
try:
    s.connect((${JSON.stringify(host)}, ${port}))
    print("CONNECTED", s.recv(10))
except OSError as e:
    print("BLOCKED", type(e).__name__, e.errno)
`;

describeEachEngineAndMode('sandbox on %s', (engine, mode) => {
  let config: Config;
  let rt: LocalRuntime;
  const logged: Record<string, unknown>[] = [];
  const run = (code: string, over: Partial<RunSpec> & { jt?: Partial<JobType> } = {}, signal?: AbortSignal) =>
    runAs(mode, rt, spec(config, code, over), signal ? { signal } : {});
  async function healthy(): Promise<void> {
    const r = await run('print(6 * 7)');
    expect(r.observation.exitCode).toBe(0);
    expect(r.stdout).toBe('42\n');
    expect((await rt.health()).available).toBe(true);
  }

  beforeAll(async () => {
    config = makeConfig(engine, modeConfig(mode));
    rt = createLocalRuntime(config, { logger: capturingLogger(logged) });
    await rt.start();
  });
  afterAll(async () => {
    await rt?.stop();
  });

  it.skipIf(mode !== 'cold')('reports the engine, isolation and how limits are enforced', async () => {
    const h = await rt.health();
    expect(h).toMatchObject({ available: true, engine, isolated: true });
    expect(['cgroups', 'rlimits']).toContain(h.limits);
    if (process.getuid?.() === 0) expect(h.limits).toBe('cgroups');
    if (engine === 'gvisor') expect(h.gvisorAvailable).toBe(true);
    // /health's sandbox.detail: snake_case keys, as on the Kubernetes runtime.
    expect(h.detail).toMatchObject({ security_mode: config.security_mode, gvisor_platform: config.gvisor_platform, runs_on_tmpfs: expect.any(Boolean) });
    for (const k of Object.keys(h.detail ?? {})) expect(k).toMatch(/^[a-z0-9]+(_[a-z0-9]+)*$/);
  });

  it('runs print(1): stdout, exit 0, completed, timings and trusted usage', async () => {
    const phases: string[] = [];
    const r = await runAs(mode, rt, spec(config, 'print(1)'), { onPhase: (p) => phases.push(p) });
    expect(r.stdout).toBe('1\n');
    expect(r.stderr).toBe('');
    expect(r.observation).toMatchObject({ exitCode: 0, timedOut: null, oomKilled: false, cancelled: false, infraError: null, phase: 'completed' });
    expect(phases).toEqual(['execution']);
    expect(r.report).toMatchObject({ phase: 'completed', exit_code: 0, timed_out: false });
    expect(r.observation.totalMs).toBeGreaterThanOrEqual(r.observation.executionMs);
    expect(r.observation.startupMs + r.observation.executionMs).toBeLessThanOrEqual(r.observation.totalMs + 1);
    expect(r.resultJson).toBeNull();
    expect(r.artifacts).toEqual([]);
    if ((await rt.health()).limits === 'cgroups') {
      expect(r.observation.maxRssMb).toBeGreaterThan(1);
      expect(r.observation.cpuTimeMs).toBeGreaterThanOrEqual(0);
    }
  });

  it('gives the §1.5 layout: input readable, code and input read-only, output and tmp writable', async () => {
    const r = await run(`
import json, os
print(json.load(open('/input/data.json'))['x'] + 1)
for p in ['/code/main.py', '/input/data.json', '/code/new.py', '/input/new.json']:
  try:
      open(p, 'a').write('x'); print('WROTE', p)
  except OSError as e:
      print('DENIED', p, e.errno in (13, 30))
open('/tmp/scratch.txt', 'w').write('tmp ok')
print(open('/tmp/scratch.txt').read())
json.dump({'answer': 42}, open('/output/result.json', 'w'))
open('/output/report.csv', 'w').write('a,b\\n1,2\\n')
print(os.getcwd())
`);
    expect(r.observation.exitCode).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe('42');
    expect(lines.filter((l) => l.startsWith('DENIED') && l.endsWith('True'))).toHaveLength(4);
    expect(r.stdout).not.toContain('WROTE');
    expect(r.stdout).toContain('tmp ok');
    expect(JSON.parse(r.resultJson!)).toEqual({ answer: 42 });
    const csv = r.artifacts.find((a) => a.name === 'report.csv')!;
    expect(csv).toMatchObject({ size: 8, contentType: 'text/csv; charset=utf-8' });
    expect(csv.data!.toString()).toBe('a,b\n1,2\n');
    expect(csv.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(r.artifacts.map((a) => a.name)).not.toContain('result.json');
    expect(r.artifacts.map((a) => a.name).some((n) => n.startsWith('.svc_'))).toBe(false);
  });

  it('refuses writes anywhere outside /output and /tmp (read-only root)', async () => {
    const r = await run(`
import errno
targets = ['/x', '/usr/x', '/usr/bin/python3', '/etc/passwd', '/etc/x', '/runner/x', '/bin/x', '/lib/x']
for t in targets:
  try:
      with open(t, 'a') as f:
          f.write('pwned')
      print('WROTE', t)
  except OSError as e:
      print('DENIED', t, errno.errorcode.get(e.errno))
`);
    expect(r.observation.exitCode).toBe(0);
    expect(r.stdout).not.toContain('WROTE');
    const denied = r.stdout.trim().split('\n');
    expect(denied).toHaveLength(8);
    for (const l of denied) expect(l).toMatch(/^DENIED \S+ (EROFS|EACCES|EPERM)$/);
    await healthy();
  });

  it('runs as uid/gid 1000 with no capabilities and no_new_privs', async () => {
    const r = await run(`
import os, ctypes
st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)
libc = ctypes.CDLL(None, use_errno=True)
print(os.getuid(), os.geteuid(), os.getgid(), os.getegid())
print(int(st['CapEff'], 16), int(st['CapPrm'], 16), int(st['CapInh'], 16), int(st.get('CapAmb', '0'), 16))
print('nnp', libc.prctl(39, 0, 0, 0, 0))
try:
  os.setuid(0); print('SETUID OK')
except OSError:  # EPERM, or EINVAL where uid 0 is not even mapped
  print('setuid denied')
`);
    expect(r.observation.exitCode).toBe(0);
    const [ids, caps, nnp, setuid] = r.stdout.trim().split('\n');
    expect(ids).toBe('1000 1000 1000 1000');
    expect(caps).toBe('0 0 0 0');
    expect(nnp).toBe('nnp 1');
    expect(setuid).toBe('setuid denied');
  });

  it('filters syscalls with seccomp (ptrace and unshare are refused)', async () => {
    const r = await run(`
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('ptrace', libc.ptrace(0, 0, 0, 0), ctypes.get_errno())
print('unshare', libc.unshare(0x10000000), ctypes.get_errno())
`);
    expect(r.observation.exitCode).toBe(0);
    expect(r.stdout).toContain('ptrace -1 1\n');
    expect(r.stdout).toMatch(/unshare -1 (1|22)\n/);
  });

  it('lets the program start threads and processes under the syscall filter', async () => {
    const r = await run(`
import concurrent.futures, subprocess, threading
got = []
t = threading.Thread(target=got.append, args=('thread',))
t.start()
t.join()
with concurrent.futures.ThreadPoolExecutor(4) as ex:
  got.append(sum(ex.map(lambda x: x * x, range(10))))
got.append(subprocess.run(['/usr/bin/python3', '-c', 'print("child")'], capture_output=True, text=True).stdout.strip())
print(got)
`);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe("['thread', 285, 'child']\n");
  });

  it('has no network: loopback service of the host and an outside address are unreachable', async () => {
    const srv = await listen();
    try {
      const r = await run(`${PY_CONNECT('127.0.0.1', srv.port)}\n${PY_CONNECT('192.0.2.1', 80)}`);
      expect(r.observation.exitCode).toBe(0);
      const lines = r.stdout.trim().split('\n');
      expect(lines).toHaveLength(2);
      for (const l of lines) expect(l).toMatch(/^BLOCKED /);
      expect(srv.connections()).toBe(0);
    } finally {
      await srv.close();
    }
    await healthy();
  });

  it('a bridge job type reaches the network (a service on the host loopback)', async () => {
    const srv = await listen();
    try {
      const r = await run(PY_CONNECT('127.0.0.1', srv.port), { jt: { network: { mode: 'bridge', allowedHosts: [] } } });
      expect(r.observation.exitCode).toBe(0);
      expect(r.stdout).toContain("CONNECTED b'hello\\n'");
      expect(srv.connections()).toBe(1);
    } finally {
      await srv.close();
    }
  });

  it('a bridge job type with allowed_hosts reaches those hosts through the proxy, and nothing else', async () => {
    const web = await httpServer();
    const other = await listen();
    try {
      const r = await run(PY_EGRESS(web.port, other.port), {
        jt: { network: { mode: 'bridge', allowedHosts: [`127.0.0.1:${web.port}`, 'localhost'] } },
      });
      expect(r.stderr).toBe('');
      expect(r.observation.exitCode).toBe(0);
      const out = JSON.parse(r.stdout) as Record<string, unknown>;
      expect(out.proxy).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(out.plain).toBe('hello /plain?q=1');
      expect(out.tunnel).toBe('hello /tunnel');
      expect(out.other_port).toBe(403);
      expect(out.private_name).toBe(403);
      expect(out.private_reason).toContain('not a public address');
      expect(String(out.https_denied)).toContain('403');
      expect(out.direct).toBe('blocked');
      expect(out.resolv).toBe('no-dns');
      expect(web.paths()).toEqual(['/plain?q=1', '/tunnel']);
      expect(other.connections()).toBe(0);
      const refused = logged.filter((l) => l.msg === 'egress refused');
      for (const l of refused) expect(l.execution_id).toEqual(expect.any(String));
      expect(refused.map((l) => `${l.host}:${l.port}`).sort()).toEqual([`127.0.0.1:${other.port}`, 'evil.example.org:443', 'localhost:80']);
    } finally {
      await web.close();
      await other.close();
    }
    await healthy();
  });

  it("never shows the service's environment, only the job type's", async () => {
    const r = await run(
      `
import os, glob
print('env', sorted(os.environ))
print('FOO', os.environ.get('FOO'))
leaks = []
for f in glob.glob('/proc/*/environ'):
  try:
      data = open(f, 'rb').read().decode('latin1')
  except OSError:
      continue
  if ${JSON.stringify(CANARY)} in data or 'SVC_DATABASE_URL' in data:
      leaks.append(f)
print('leaks', leaks)
print('self', open('/proc/self/environ','rb').read().decode().split('\\0'))
`,
      { jt: { env: { FOO: 'bar' } } },
    );
    expect(r.observation.exitCode).toBe(0);
    expect(r.stdout).not.toContain(CANARY);
    expect(r.stdout).not.toContain('SVC_DATABASE_URL');
    expect(r.stdout).toContain('leaks []');
    expect(r.stdout).toContain('FOO bar');
  });

  it('classifies nothing but reports the exception class, missing module and CPython traceback', async () => {
    const r = await run('import json\nimport no_such_module_xyz\n');
    expect(r.observation.exitCode).toBe(1);
    expect(r.observation.phase).toBe('failed');
    expect(r.report).toMatchObject({ exit_code: 1, exception: 'ModuleNotFoundError', missing_module: 'no_such_module_xyz' });
    expect(r.report?.exception_mro).toContain('ImportError');
    expect(r.stderr).toBe(
      `Traceback (most recent call last):\n  File "/code/main.py", line 2, in <module>\n    import no_such_module_xyz\nModuleNotFoundError: No module named 'no_such_module_xyz'\n`,
    );
    const s = await run('x = (\n');
    expect(s.report?.exception).toBe('SyntaxError');
    expect(s.stderr).toMatch(/^ {2}File "\/code\/main.py", line 1\n/);
    const e = await run('import sys\nprint("out")\nsys.exit(3)\n');
    expect(e.observation.exitCode).toBe(3);
    expect(e.stdout).toBe('out\n');
  });

  it('caps stdout at max_stdout_bytes with the truncation flag', async () => {
    const r = await run('import sys\nsys.stdout.write("a" * 100000)\nsys.stderr.write("e" * 10)\n', { maxStdoutBytes: 1024 });
    expect(r.observation.exitCode).toBe(0);
    expect(r.stdout).toBe('a'.repeat(1024));
    expect(r.stdoutTruncated).toBe(true);
    expect(r.stderr).toBe('e'.repeat(10));
    expect(r.stderrTruncated).toBe(false);
  });

  it('kills code that exceeds its execution timeout (whole process group)', async () => {
    const t0 = Date.now();
    const r = await run('import os\nos.fork()\nwhile True:\n    pass\n', { timeoutSec: 1 });
    expect(r.observation.timedOut).toBe('execution');
    expect(r.observation.phase).toBe('execution');
    // The runner's deadline counts from the go; the runtime's execution time from when it read the
    // marker, which a loaded machine (the program's two spinning processes, other work) may delay.
    expect(r.observation.executionMs).toBeGreaterThanOrEqual(500);
    expect(Date.now() - t0).toBeLessThan(8000);
    await healthy();
  });

  it('bounds a fork bomb by the process limit, and the run ends', async () => {
    const r = await run(
      `
import os, time
n = 0
try:
  while n < 10000:
      if os.fork() == 0:
          time.sleep(60)
          os._exit(0)
      n += 1
except OSError as e:
  print('limited', n, e.errno)
`,
      { jt: { maxProcesses: 32 }, timeoutSec: 20 },
    );
    expect(r.observation.exitCode).toBe(0);
    const m = /^limited (\d+) 11$/.exec(r.stdout.trim());
    expect(m, r.stdout + r.stderr).not.toBeNull();
    expect(Number(m![1])).toBeLessThanOrEqual(32);
    expect(r.observation.executionMs).toBeLessThan(15000);
    await healthy();
  });

  it('kills a memory bomb with SIGKILL (137) and reports the OOM kill', async () => {
    const r = await run('x = []\nwhile True:\n    x.append(bytearray(32 * 1024 * 1024))\n', { jt: { memoryLimit: '256m' } });
    expect(r.observation.exitCode).toBe(137);
    if ((await rt.health()).limits === 'cgroups') expect(r.observation.oomKilled).toBe(true);
    await healthy();
  });

  it('stops a 2 GB file at the file-size limit without filling the host disk', async () => {
    const r = await run(
      `
import os
chunk = b'x' * (1 << 20)
with open('/output/big.bin', 'wb', buffering=0) as f:
  for i in range(2048):
      f.write(chunk)
`,
      { jt: { maxFileSize: '10m' } },
    );
    expect([1, 153]).toContain(r.observation.exitCode);
    if (r.observation.exitCode === 1) {
      expect(r.report?.exception).toBe('OSError');
      expect(r.stderr).toContain('File too large');
    }
    const big = r.artifacts.find((a) => a.name === 'big.bin')!;
    expect(big.skipped).toBe('too_large');
    expect(big.data).toBeUndefined();
    expect(big.size).toBeLessThanOrEqual(10 * 1024 * 1024);
    await healthy();
  });

  it('survives user code killing the runner', async () => {
    const t0 = Date.now();
    const r = await run('import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(1)\nprint("survived")\n');
    expect(Date.now() - t0).toBeLessThan(10000);
    expect(r.observation.oomKilled).toBe(false);
    expect(r.observation.timedOut).toBeNull();
    if (engine === 'gvisor') {
      // The runner dies (gVisor delivers the SIGKILL even though the runner is the container's init),
      // the sandbox goes with it, and the runtime sees 137 without an OOM kill and without a report.
      expect(r.observation.exitCode).toBe(137);
      expect(r.report).toBeNull();
      expect(r.stdout).not.toContain('survived');
    } else {
      // bwrap --as-pid-1: the program's parent (the runner, or the in-process path's waiting sh) is
      // PID 1 of the sandbox's PID namespace, and Linux drops a SIGKILL sent to it from inside.
      expect(r.observation.exitCode).toBe(0);
      expect(r.stdout).toBe('survived\n');
    }
    await healthy();
  });

  it('never follows symlinks out of /output; subdirectories are listed, not read', async () => {
    const r = await run(`
import os
os.symlink('/etc/passwd', '/output/passwd')
os.symlink('/proc/self/environ', '/output/.svc_stdout.tmp')
os.mkdir('/output/sub')
open('/output/sub/inner.txt', 'w').write('inner')
open('/output/_code.py', 'w').write('reserved')
open('/output/large.bin', 'wb').write(b'z' * 2000)
open('/output/ok.json', 'w').write('{}')
os.remove('/output/.svc_report.json') if os.path.exists('/output/.svc_report.json') else None
`, { maxArtifactBytes: 1000 });
    expect(r.observation.exitCode).toBe(0);
    const by = Object.fromEntries(r.artifacts.map((a) => [a.name, a]));
    expect(by.passwd).toMatchObject({ skipped: 'not_regular' });
    expect(by.passwd!.data).toBeUndefined();
    expect(by.sub).toMatchObject({ skipped: 'not_regular' });
    expect(by['sub/inner.txt']).toBeUndefined();
    expect(by._code_py).toBeUndefined();
    expect(by['_code.py']).toMatchObject({ skipped: 'reserved_name' });
    expect(by['large.bin']).toMatchObject({ skipped: 'too_large', size: 2000 });
    expect(by['ok.json']).toMatchObject({ size: 2, contentType: 'application/json' });
    expect(by['ok.json']!.data!.toString()).toBe('{}');
  });

  it('cancels a running sandbox promptly', async () => {
    const ac = new AbortController();
    const t0 = Date.now();
    const p = runAs(mode, rt, spec(config, 'import time\ntime.sleep(30)\n'), {
      signal: ac.signal,
      onPhase: () => setTimeout(() => ac.abort(), 200),
    });
    const r = await p;
    expect(r.observation.cancelled).toBe(true);
    expect(r.observation.exitCode).toBeNull();
    expect(Date.now() - t0).toBeLessThan(10000);
    await healthy();
  });

  it.skipIf(mode !== 'cold')('start() removes what an earlier service on the same workspace left running', async () => {
    const crashedConfig = makeConfig(engine, modeConfig('cold'));
    const crashed = createLocalRuntime(crashedConfig);
    await crashed.start();
    let began!: () => void;
    const inExecution = new Promise<void>((r) => (began = r));
    const orphan = crashed.run(spec(crashedConfig, 'import time\ntime.sleep(60)\n'), { onPhase: () => began() });
    await inExecution;
    // A new service on the same workspace (the old one "crashed" without stop()).
    const t0 = Date.now();
    const successor = createLocalRuntime(crashedConfig);
    await successor.start();
    try {
      const r = await orphan;
      expect(Date.now() - t0).toBeLessThan(15000);
      // Killed from outside: whatever status the dying sandbox reported, it is not a success.
      expect(r.observation.exitCode, JSON.stringify(r.observation)).not.toBe(0);
      const ok = await successor.run(spec(crashedConfig, 'print(3)'));
      expect(ok.stdout).toBe('3\n');
    } finally {
      await successor.stop();
    }
  });

  it.skipIf(mode !== 'cold')('rejects adopt with RunGoneError', async () => {
    await expect(rt.run(spec(config, 'print(1)'), { adopt: true })).rejects.toBeInstanceOf(RunGoneError);
  });

  it('limits CPU to the job type cpu_limit', async () => {
    const cpuLimit = 0.5;
    const r = await run('import time\nt = time.time()\nwhile time.time() - t < 2:\n    pass\n', { jt: { cpuLimit } });
    expect(r.observation.exitCode).toBe(0);
    if ((await rt.health()).limits === 'cgroups') {
      // The quota holds the sandbox's whole group (a cold gVisor's boot too), so what it may use is
      // cpuLimit x the run's time plus a CFS period or so of slack; unthrottled the spin alone would use
      // ~2000 ms. A fixed 1500 ms bound failed (1507, 1572 ms) when a loaded machine made the cold
      // boot slow: within the quota, as cpuLimit x totalMs says. Less on a machine loaded by others: only
      // that the counter saw the program's work is asserted below.
      const { cpuTimeMs, totalMs } = r.observation;
      expect(cpuTimeMs!, JSON.stringify({ cpuTimeMs, totalMs })).toBeLessThanOrEqual(cpuLimit * totalMs + 150);
      expect(cpuTimeMs!).toBeGreaterThan(100);
    }
  });

  // A warm sandbox starts without the CPU limit (launch-warm.ts: a restore capped at one CPU took twice
  // as long) and gets the run's at the go, before the program exists: seen from the host's cgroup
  // files while the program runs (with the go's setLimits removed, no group of this instance has it).
  it.skipIf(mode === 'cold')("a claimed warm sandbox runs under the run's CPU limit", async () => {
    const { instance } = instanceRoot(config);
    const quotas = (): string[] => {
      const out: string[] = [];
      for (const [parent, file, parse] of [
        [`/sys/fs/cgroup/cpu/sandpod/${instance}`, 'cpu.cfs_quota_us', (t: string) => t.trim()],
        [`/sys/fs/cgroup/sandpod/${instance}`, 'cpu.max', (t: string) => t.trim().split(' ')[0]!],
      ] as const) {
        if (!existsSync(parent)) continue;
        for (const d of readdirSync(parent, { withFileTypes: true })) {
          if (!d.isDirectory()) continue;
          try {
            out.push(parse(readFileSync(path.join(parent, d.name, file), 'utf8')));
          } catch {
            // removed meanwhile
          }
        }
      }
      return out;
    };
    if ((await rt.health()).limits !== 'cgroups') return;
    let done = false;
    const p = run('import time\ntime.sleep(2)\n', { jt: { cpuLimit: 0.25 } }).finally(() => (done = true));
    let seen = false;
    while (!done && !seen) {
      seen = quotas().includes('25000');
      await new Promise((r) => setTimeout(r, 25));
    }
    expect((await p).observation.exitCode).toBe(0);
    expect(seen).toBe(true);
  });

  describe.skipIf(mode !== 'cold')('requirements (never on warm sandboxes)', () => {
    it('installs a requirement in the startup phase, then reuses the cached environment', async () => {
      const code = 'import sandpod_testpkg, sys\nprint(sandpod_testpkg.VALUE)\nprint([p for p in sys.path if p == "/deps"])\n';
      const first = await run(code, { requirements: ['sandpod-testpkg==1.2.3'] });
      expect(first.observation.dependencyError).toBeNull();
      expect(first.observation.exitCode).toBe(0);
      expect(first.stdout).toBe("sandpod-testpkg-1.2.3\n['/deps']\n");
      expect(first.observation.depInstallMs).toBeGreaterThan(50);
      expect(first.observation.startupMs).toBeGreaterThanOrEqual(first.observation.depInstallMs);
      const second = await run(code, { requirements: ['sandpod-testpkg==1.2.3'] });
      expect(second.stdout).toBe(first.stdout);
      expect(second.observation.depInstallMs).toBeLessThan(20);
      // The environment is read-only for user code, and not owned by the sandbox uid either.
      const ro = await run("import os\nprint(os.stat('/deps/sandpod_testpkg/__init__.py').st_uid != 1000, flush=True)\nopen('/deps/sandpod_testpkg/__init__.py', 'a')\n", { requirements: ['sandpod-testpkg==1.2.3'] });
      expect(ro.stdout).toBe('True\n');
      expect(ro.observation.exitCode).toBe(1);
      expect(ro.stderr).toMatch(/Read-only file system|Permission denied/);
    });

    it("reports pip's message when a requirement cannot be installed", async () => {
      const r = await run('print(1)', { requirements: ['no-such-package-sandpod-xyz'] });
      expect(r.observation.dependencyError).toMatch(/No matching distribution found for no-such-package-sandpod-xyz/);
      expect(r.observation.phase).toBe('startup');
      expect(r.stdout).toBe('');
      const opt = await run('print(1)', { requirements: ['--index-url=http://example.invalid/'] });
      expect(opt.observation.dependencyError).toMatch(/looks like a pip option/);
      await healthy();
    });

    it('times out in the startup phase when the install exceeds startup_timeout', async () => {
      // An index that accepts connections and never answers: pip waits, the startup deadline fires.
      const sockets: net.Socket[] = [];
      const hang = net.createServer((s) => void sockets.push(s));
      await new Promise<void>((r) => hang.listen(0, '127.0.0.1', r));
      const port = (hang.address() as net.AddressInfo).port;
      const slowConfig = makeConfig(engine, { ...modeConfig('cold'), pip: { index_url: `http://127.0.0.1:${port}/simple/` } });
      const slow = createLocalRuntime(slowConfig);
      await slow.start();
      try {
        const t0 = Date.now();
        // 8 s: pip under gVisor on a busy 2-core machine takes up to ~3 s to reach the index, and more
        // now that it goes through the runner's relay and the egress proxy (seen over 5 s under load).
        const r = await slow.run(spec(slowConfig, 'print(1)', { requirements: ['anything-at-all'], startupTimeoutSec: 8 }));
        expect(r.observation.timedOut).toBe('startup');
        expect(r.observation.phase).toBe('startup');
        expect(r.observation.exitCode).toBeNull();
        expect(Date.now() - t0).toBeGreaterThanOrEqual(7900);
        expect(Date.now() - t0).toBeLessThan(16000);
        expect(sockets.length).toBeGreaterThan(0);
        const ok = await slow.run(spec(slowConfig, 'print(2)'));
        expect(ok.stdout).toBe('2\n');
      } finally {
        await slow.stop();
        for (const s of sockets) s.destroy();
        hang.close();
      }
    });
  });
});

describe('sandbox on process (no isolation, permissive only)', () => {
  let config: Config;
  let rt: LocalRuntime;
  beforeAll(async () => {
    config = makeConfig('process');
    rt = createLocalRuntime(config);
    await rt.start();
  });
  afterAll(async () => {
    await rt?.stop();
  });

  it('says it is not isolated', async () => {
    expect(await rt.health()).toMatchObject({ available: true, engine: 'process', isolated: false });
  });

  // No namespaces: the program sees host paths (the run directory), not the §1.5 layout.
  it('runs code with output, exceptions and the timeout', async () => {
    const r = await rt.run(spec(config, "import os\nprint(os.getuid() if os.getuid() == 1000 else 'not-1000', 1 + 1)\n"));
    expect(r.observation.exitCode).toBe(0);
    expect(r.stdout).toBe(process.getuid?.() === 0 ? '1000 2\n' : 'not-1000 2\n');
    const e = await rt.run(spec(config, '{}["k"]\n'));
    expect(e.observation.exitCode).toBe(1);
    expect(e.report?.exception).toBe('KeyError');
    const t = await rt.run(spec(config, 'while True: pass\n', { timeoutSec: 1 }));
    expect(t.observation.timedOut).toBe('execution');
  });

  it("does not hand the service's environment to the program", async () => {
    const r = await rt.run(spec(config, 'import os\nprint(sorted(os.environ))\n'));
    expect(r.stdout).not.toContain('SVC_DATABASE_URL');
    expect(r.stdout).not.toContain('SANDPOD_TEST_CANARY');
  });

  it('is refused in strict mode, which requires gVisor', async () => {
    const strict = createLocalRuntime(makeConfig('process', { security_mode: 'strict' }));
    await expect(strict.start()).rejects.toThrow(/strict/);
    const strictBwrap = createLocalRuntime(makeConfig('bubblewrap', { security_mode: 'strict' }));
    await expect(strictBwrap.start()).rejects.toThrow(/strict/);
  });
});

describe('engine selection', () => {
  it('auto picks the strongest engine that works', async () => {
    const bins = findEngineBinaries({ container_runtime: 'runsc' });
    const config = makeConfig('process', { sandbox_engine: 'auto' });
    const rt = createLocalRuntime(config);
    await rt.start();
    try {
      const expected = bins.runsc ? 'gvisor' : bins.bwrap ? 'bubblewrap' : 'process';
      expect(rt.engine).toBe(expected);
    } finally {
      await rt.stop();
    }
  });

  it('strict with auto starts on gVisor when it is installed', async () => {
    const bins = findEngineBinaries({ container_runtime: 'runsc' });
    const rt = createLocalRuntime(makeConfig('process', { sandbox_engine: 'auto', security_mode: 'strict' }));
    if (!bins.runsc) {
      await expect(rt.start()).rejects.toThrow(/strict requires gVisor/);
      return;
    }
    await rt.start();
    expect(rt.engine).toBe('gvisor');
    await rt.stop();
  });
});
