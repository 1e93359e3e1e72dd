/**
 * runner.py `--session --go-port` (a Kubernetes session pod's cell channel): the first loopback
 * connection to the port is the channel, both ways (cell lines in, frames out), accepted after the
 * interpreter was forked; the port is let go at once, so nothing else (a cell included) can connect
 * later; with `--ready-listen` the ready port answers probes until then; the channel's end ends the
 * session. Driven with the system Python over real loopback connections, as the collector drives it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SessionFrames, type SessionFrame } from '../../../src/runtime/local/session/frames.ts';
import { RUNNER_PATH } from '../../../src/sandbox/paths.ts';
import { freePort } from '../../support/process.ts';

const PY = '/usr/bin/python3';
const CLEAN = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', TMPDIR: '/tmp', LANG: 'C.UTF-8' };
const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

function connectRetry(port: number, ms = 10_000): Promise<Socket> {
  const end = Date.now() + ms;
  return new Promise((resolve, reject) => {
    const attempt = () => {
      const s = connect(port, '127.0.0.1');
      s.once('connect', () => resolve(s));
      s.once('error', (e) => (Date.now() < end ? setTimeout(attempt, 25) : reject(e)));
    };
    attempt();
  });
}

const refused = (port: number) =>
  new Promise<string>((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve('connected');
    });
    s.once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'error'));
  });

describe('runner --session --go-port', () => {
  it('takes its cells on the first connection, lets the port go, keeps state, and ends when the connection does', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'sess-port-'));
    const [goPort, readyPort] = [await freePort(), await freePort()];
    const child = spawn(PY, [RUNNER_PATH, '--code', path.join(dir, 'x.py'), '--output', dir, '--cwd', dir, '--timeout', '30', '--session', '--go-port', String(goPort), '--ready-listen', `127.0.0.1:${readyPort}`], { env: CLEAN, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let stderr = '';
    child.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
    const exited = new Promise<number | null>((r) => child.on('close', (c) => r(c)));
    // Probes of the ready port are answered (connected, closed) before the channel exists.
    const probe = await connectRetry(readyPort);
    probe.destroy();
    const chan = await connectRetry(goPort);
    const frames: SessionFrame[] = [];
    const parser = new SessionFrames();
    chan.on('data', (b: Buffer) => frames.push(...parser.push(b)));
    const waitFor = async (pred: () => boolean) => {
      for (const end = Date.now() + 10_000; Date.now() < end && !pred(); ) await new Promise((r) => setTimeout(r, 20));
      expect(pred(), stderr).toBe(true);
    };
    await waitFor(() => frames.some((f) => f.kind === 'ready'));
    // The port and the ready port are let go: nothing else can connect to the runner now.
    expect(await refused(goPort)).toBe('ECONNREFUSED');
    expect(await refused(readyPort)).toBe('ECONNREFUSED');
    const cell = (n: number, code: string) => {
      writeFileSync(path.join(dir, `cell-${n}.py`), code);
      chan.write(JSON.stringify({ cell: n, code: path.join(dir, `cell-${n}.py`), timeout: 10, max_stream_bytes: 1000, env: {} }) + '\n');
    };
    cell(1, 'x = 41');
    await waitFor(() => frames.filter((f) => f.kind === 'result').length === 1);
    // A cell that tries to reach the port gets nowhere.
    cell(2, `import socket\ntry:\n    socket.create_connection(("127.0.0.1", ${goPort}), timeout=2)\n    print("reached", x + 1)\nexcept OSError as e:\n    print(type(e).__name__, x + 1)`);
    await waitFor(() => frames.filter((f) => f.kind === 'result').length === 2);
    const out = Buffer.concat(frames.flatMap((f) => (f.kind === 'o' ? [f.data] : []))).toString();
    expect(out).toBe('ConnectionRefusedError 42\n');
    chan.end();
    expect(await exited).toBe(0);
  }, 30_000);
});
