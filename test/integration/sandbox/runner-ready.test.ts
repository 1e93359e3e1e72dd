/**
 * runner.py `--ready-listen` (Kubernetes pool pods' readiness, probed by a `tcpSocket` startup
 * probe): the runner listens on the ready address only once its go port is held and the held
 * program process's preloads are imported, accepts and closes probe connections while it waits,
 * and closes the listener when the go connection comes, so the program never holds it. Driven with
 * the system Python, the go line sent over a real loopback connection as the collector sends it.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { RUNNER_PATH } from '../../../src/sandbox/paths.ts';
import { freePort } from '../../support/process.ts';

const PY = '/usr/bin/python3';
const CLEAN = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', TMPDIR: '/tmp', LANG: 'C.UTF-8' };
const children: ChildProcess[] = [];

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

/** What a probe sees: 'open' (connected, then closed by the runner without a byte), or the error code. */
async function probe(port: number): Promise<string> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let got = '';
    s.on('data', (b) => (got += b.toString()));
    s.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'error'));
    s.on('end', () => {
      s.destroy();
      resolve(got === '' ? 'open' : `data:${got}`);
    });
  });
}

async function until(pred: () => boolean | Promise<boolean>, ms = 15_000): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; ) {
    if (await pred()) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return false;
}

function start(prefix: string, args: string[]) {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const dir = mkdtempSync(path.join('/tmp/sandpod-test', prefix));
  mkdirSync(path.join(dir, 'out'));
  const child = spawn(PY, [RUNNER_PATH, '--code', path.join(dir, 'main.py'), '--output', path.join(dir, 'out'), '--cwd', dir, '--timeout', '30', '--wait', ...args], { env: CLEAN, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let err = '';
  child.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  child.stdout!.resume();
  const exited = new Promise<number | null>((r) => child.on('close', (c) => r(c)));
  return { dir, child, exited, err: () => err };
}

/** Connects to the go port as the collector does, sends the go line with `code`; the phase lines. */
/**
 * The runner's phase lines on the go connection, and apart from them the report's files it sends
 * before `done` (a line `control NAME LEN ...` and their bytes, for the collector's archive).
 */
async function go(port: number, code: string): Promise<{ phases: string; control: Record<string, string> }> {
  const sock: Socket = await new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
  const chunks: Buffer[] = [];
  sock.on('data', (b: Buffer) => chunks.push(b));
  sock.write(`${JSON.stringify({ code })}\n`);
  await new Promise((r) => sock.on('close', r));
  let raw = Buffer.concat(chunks);
  const control: Record<string, string> = {};
  const at = raw.indexOf('control ');
  if (at >= 0) {
    const nl = raw.indexOf('\n', at);
    const parts = raw.subarray(at + 'control '.length, nl).toString().split(' ');
    let pos = nl + 1;
    for (let i = 0; i < parts.length; i += 2) {
      const n = Number(parts[i + 1]);
      control[parts[i]!] = raw.subarray(pos, pos + n).toString();
      pos += n;
    }
    raw = Buffer.concat([raw.subarray(0, at), raw.subarray(pos)]);
  }
  return { phases: raw.toString(), control };
}

describe('runner.py --ready-listen', () => {
  it('listens only after the preloads, tolerates probes, and is gone before the program runs', async () => {
    const [goPort, readyPort] = [await freePort(), await freePort()];
    const lib = mkdtempSync(path.join('/tmp/sandpod-test', 'ready-lib-'));
    const mark = path.join(lib, 'imported');
    writeFileSync(path.join(lib, 'slow.py'), `import time\ntime.sleep(1.5)\nopen(${JSON.stringify(mark)}, 'w').write('x')\n`);
    const r = start('ready-ok-', ['--go-port', String(goPort), '--preload', 'slow', '--python-path', lib, '--ready-listen', `127.0.0.1:${readyPort}`]);
    // Not ready while the preload runs: the port is closed (the go port is held already).
    await new Promise((res) => setTimeout(res, 400));
    expect(await probe(readyPort)).toBe('ECONNREFUSED');
    let atReady: boolean | null = null;
    expect(await until(async () => (await probe(readyPort)) === 'open')).toBe(true);
    atReady = (() => {
      try {
        return readFileSync(mark, 'utf8') === 'x';
      } catch {
        return false;
      }
    })();
    expect(atReady).toBe(true);
    // Probes keep coming (a kubelet's every period): each is accepted and closed, none is the go.
    for (let i = 0; i < 20; i++) expect(await probe(readyPort)).toBe('open');
    expect(r.child.exitCode).toBeNull();
    // The program: the listener is not among its fds, nothing answers on the port, and the port is free.
    const program = `
import os, socket
kinds = []
for f in os.listdir('/proc/self/fd'):
    try:
        kinds.append(os.readlink('/proc/self/fd/' + f).split(':')[0])
    except OSError:
        pass  # the directory listdir read, closed by now
s = socket.socket()
try:
    s.connect(('127.0.0.1', ${readyPort}))
    reach = 'connected'
except OSError as e:
    reach = type(e).__name__
s.close()
b = socket.socket()
b.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
b.bind(('127.0.0.1', ${readyPort}))
print(kinds, reach, 'bound')
`;
    const { phases } = await go(goPort, program);
    expect(phases, readFileSync(path.join(r.dir, 'out', '.svc_stderr'), 'utf8')).toBe('ready\nexecution\ndone 0\n');
    expect(await r.exited).toBe(0);
    expect(readFileSync(path.join(r.dir, 'out', '.svc_stdout'), 'utf8')).toMatch(/^\[[^\]]*\] ConnectionRefusedError bound\n$/);
    expect(readFileSync(path.join(r.dir, 'out', '.svc_stdout'), 'utf8')).not.toContain("'socket'");
  });

  it('without --preload it is ready at once, and the go connection works while probes come', async () => {
    const [goPort, readyPort] = [await freePort(), await freePort()];
    const r = start('ready-plain-', ['--go-port', String(goPort), '--ready-listen', `127.0.0.1:${readyPort}`]);
    expect(await until(async () => (await probe(readyPort)) === 'open')).toBe(true);
    let probing = true;
    const probes = (async () => {
      while (probing) await probe(readyPort);
    })();
    const { phases, control } = await go(goPort, 'print(6 * 7)\n');
    expect(phases).toBe('ready\nexecution\ndone 0\n');
    // The report's files, before `done`, as they are written into --output.
    expect(Object.keys(control)).toEqual(['.svc_stdout', '.svc_stderr', '.svc_report.json', '.svc_phase']);
    expect(control).toMatchObject({ '.svc_stdout': '42\n', '.svc_stderr': '', '.svc_phase': 'completed' });
    expect(JSON.parse(control['.svc_report.json']!)).toMatchObject({ phase: 'completed', exit_code: 0 });
    probing = false;
    await probes;
    expect(await r.exited).toBe(0);
    expect(readFileSync(path.join(r.dir, 'out', '.svc_stdout'), 'utf8')).toBe('42\n');
    expect(await probe(readyPort)).toBe('ECONNREFUSED');
  });

  it('a program process that dies while preloading ends the runner; it never says ready', async () => {
    const [goPort, readyPort] = [await freePort(), await freePort()];
    const lib = mkdtempSync(path.join('/tmp/sandpod-test', 'ready-die-'));
    writeFileSync(path.join(lib, 'dies.py'), 'import os\nos._exit(9)\n');
    const r = start('ready-die-', ['--go-port', String(goPort), '--preload', 'dies', '--python-path', lib, '--ready-listen', `127.0.0.1:${readyPort}`]);
    expect(await r.exited).toBe(125);
    expect(r.err()).toContain('the program process ended before it was ready');
    expect(await probe(readyPort)).toBe('ECONNREFUSED');
  });

  it('needs --go-port, and an address it can listen on', () => {
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'ready-bad-'));
    const run = (args: string[]) => spawnSync(PY, [RUNNER_PATH, '--code', path.join(dir, 'main.py'), '--output', dir, '--wait', ...args], { env: CLEAN, encoding: 'utf8', timeout: 20_000 });
    const noGo = run(['--ready-listen', '127.0.0.1:1']);
    expect(noGo.status).toBe(125);
    expect(noGo.stderr).toContain('--ready-listen needs --go-port');
    for (const bad of ['192.0.2.1:7720', 'nohost', '127.0.0.1:x']) {
      const r = run(['--go-port', '0', '--ready-listen', bad]);
      expect(r.status, bad).toBe(125);
      expect(r.stderr, bad).toContain(`cannot listen on ${bad}`);
    }
  });
});
