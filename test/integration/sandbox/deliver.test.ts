/**
 * The hand-over pair of a Kubernetes attach pod, as real processes: deliver.py (the collector) takes
 * the program and input on stdin, writes them, and passes the go line to the runner (`--wait
 * --go-port`) over loopback; the runner's phase lines come back through deliver's stdout, while the
 * runner's own stdout and stderr carry only the program's output (`--tee`), as a cold pod's log does.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, existsSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { RUNNER_NOT_DELIVERED_EXIT } from '../../../src/runtime/run-output.ts';
import { CollectorStream } from '../../../src/runtime/kubernetes/runs/collector-stream.ts';
import { handOverPayload } from '../../../src/runtime/kubernetes/runs/hand-over.ts';
import { defaultOutputLimits, parseOutputTar, type CollectedOutput } from '../../../src/runtime/kubernetes/runs/output-tar.ts';
import { CLAIM_FILE, FENCE_COMMAND } from '../../../src/runtime/kubernetes/names.ts';
import { DELIVER_PATH, RUNNER_PATH } from '../../../src/sandbox/paths.ts';
import { freePort } from '../../support/process.ts';

const PY = '/usr/bin/python3';
const CLEAN = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', TMPDIR: '/tmp', LANG: 'C.UTF-8' };
const children: ChildProcess[] = [];

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

function collect(c: ChildProcess): { out: () => string; raw: () => Buffer; err: () => string; exited: Promise<number | null> } {
  const out: Buffer[] = [];
  let err = '';
  c.stdout?.on('data', (b: Buffer) => out.push(b));
  c.stderr?.on('data', (b: Buffer) => (err += b.toString()));
  return { out: () => Buffer.concat(out).toString(), raw: () => Buffer.concat(out), err: () => err, exited: new Promise((r) => c.on('close', (code) => r(code))) };
}

/** deliver's stdout as the service reads it (collector-stream.ts, output-tar.ts): its text lines and the outputs archive. */
async function readCollector(raw: Buffer): Promise<{ lines: string[]; output: CollectedOutput | null }> {
  const lines: string[] = [];
  let parsing: Promise<CollectedOutput> | null = null;
  let pipe: PassThrough | null = null;
  const stream = new CollectorStream({
    line: (t) => lines.push(t),
    outputsStart: () => {
      pipe = new PassThrough();
      parsing = parseOutputTar(pipe, defaultOutputLimits(1 << 20, 1 << 20));
    },
    outputsData: (c) => pipe!.write(c),
    outputsEnd: () => pipe!.end(),
  });
  // In small pieces, as an attach delivers them.
  for (let i = 0; i < raw.length; i += 1000) stream.feed(raw.subarray(i, i + 1000));
  return { lines, output: parsing ? await parsing : null };
}

async function until(pred: () => boolean, ms = 10_000): Promise<void> {
  for (const end = Date.now() + ms; !pred() && Date.now() < end; ) await new Promise((r) => setTimeout(r, 20));
}

async function pair(prefix: string, withOutput = false) {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const dir = mkdtempSync(path.join('/tmp/sandpod-test', prefix));
  for (const d of ['code', 'input', 'out', 'control']) mkdirSync(path.join(dir, d));
  const port = await freePort();
  const code = path.join(dir, 'code', 'main.py');
  const input = path.join(dir, 'input', 'data.json');
  const runnerProc = spawn(PY, [RUNNER_PATH, '--code', code, '--input', input, '--output', path.join(dir, 'out'), '--cwd', dir, '--tee', '--wait', '--go-port', String(port)], { env: CLEAN, stdio: ['ignore', 'pipe', 'pipe'] });
  const output = withOutput ? ['--output', path.join(dir, 'out')] : [];
  const deliverProc = spawn(PY, [DELIVER_PATH, '--code', code, '--input', input, '--go-port', String(port), '--release', path.join(dir, 'control', 'release'), '--claim', path.join(dir, 'control', 'claim'), ...output], { env: CLEAN, stdio: ['pipe', 'pipe', 'pipe'] });
  children.push(runnerProc, deliverProc);
  return { dir, code, input, port, runner: collect(runnerProc), deliver: collect(deliverProc), deliverProc, runnerProc };
}

/** The new holder's fence (FENCE_COMMAND), as exec'd in the collector, on this pair's /control. */
async function fence(dir: string): Promise<number | null> {
  const cmd = FENCE_COMMAND.map((a) => a.replaceAll(CLAIM_FILE, path.join(dir, 'control', 'claim')));
  const c = spawn(cmd[0] === 'python3' ? PY : cmd[0]!, cmd.slice(1), { env: CLEAN, stdio: 'ignore' });
  return await new Promise((r) => c.on('close', (code) => r(code)));
}

describe('deliver.py and runner --go-port', () => {
  it('hands the program over: files written by deliver, go over loopback, phases on deliver, program output on the runner', async () => {
    const p = await pair('deliver-ok-');
    const program = 'import json, sys\nprint(json.load(open(sys.argv[0].replace("code/main.py", "input/data.json")))["k"])\nprint("to stderr", file=sys.stderr)\nsys.exit(3)\n';
    p.deliverProc.stdin!.write(handOverPayload({ code: program, inputJson: '{"k": "wörld"}', timeoutSec: 10, maxStdoutBytes: 1000 }));
    expect(await p.runner.exited).toBe(3);
    await until(() => p.deliver.out().includes('done'));
    expect(p.deliver.out()).toBe('ready\nexecution\ndone 3\n');
    // The runner's own streams: the program's output only (what `kubectl logs -c main` shows).
    expect(p.runner.out()).toBe('wörld\n');
    expect(p.runner.err()).toBe('to stderr\n');
    expect(readFileSync(p.code, 'utf8')).toBe(program);
    expect(readFileSync(path.join(p.dir, 'out', '.svc_stdout'), 'utf8')).toBe('wörld\n');
    // Then deliver is the collector: it exits 0 once released.
    writeFileSync(path.join(p.dir, 'control', 'release'), '');
    expect(await p.deliver.exited).toBe(0);
  });

  it('with --output, the outputs archive comes before done: the runner\'s files from the bytes it sent (never relayed), the program\'s from the directory; the files are written as well', async () => {
    const p = await pair('deliver-outputs-', true);
    const out = path.join(p.dir, 'out');
    // Over 64 KiB of stdout (the control bytes span several reads), a file of its own, and a
    // symlink where the runner's stderr goes: the archive has the runner's stderr, not the link.
    const program = [
      'import os, sys',
      `open(${JSON.stringify(path.join(out, 'art.txt'))}, "w").write("an artifact")`,
      `os.symlink("/etc/passwd", ${JSON.stringify(path.join(out, '.svc_stderr'))})`,
      'print("x" * 100000)',
      'print("to stderr", file=sys.stderr)',
    ].join('\n');
    p.deliverProc.stdin!.write(handOverPayload({ code: program, inputJson: '{}', timeoutSec: 10, maxStdoutBytes: 1 << 20 }));
    expect(await p.runner.exited).toBe(0);
    await until(() => p.deliver.raw().includes('done 0\n'));
    const { lines, output } = await readCollector(p.deliver.raw());
    expect(lines).toEqual(['ready', 'execution', 'outputs-end ok', 'done 0']);
    expect(output!.stdout).toBe('x'.repeat(100000) + '\n');
    expect(output!.stderr).toBe('to stderr\n');
    expect(output!.report).toMatchObject({ phase: 'completed', exit_code: 0 });
    expect(output!.artifacts.map((a) => [a.name, a.data?.toString()])).toEqual([['art.txt', 'an artifact']]);
    // Written into the directory too (an exec'd pull after a failed archive reads them there).
    expect(readFileSync(path.join(out, '.svc_stderr'), 'utf8')).toBe('to stderr\n');
    expect(readFileSync(path.join(out, '.svc_phase'), 'utf8')).toBe('completed');
    writeFileSync(path.join(p.dir, 'control', 'release'), '');
    expect(await p.deliver.exited).toBe(0);
  });

  it('with --output and a runner that sends no control line, the directory is archived whole at done', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'deliver-nocontrol-'));
    for (const d of ['code', 'input', 'out', 'control']) mkdirSync(path.join(dir, d));
    // A stand-in for the runner: takes the go line, writes the report files itself, says done.
    const server = createServer((sock) => {
      sock.write('ready\n');
      sock.once('data', () => {
        writeFileSync(path.join(dir, 'out', '.svc_stdout'), 'from the directory\n');
        writeFileSync(path.join(dir, 'out', 'left.bin'), 'left');
        sock.end('execution\ndone 0\n');
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as import('node:net').AddressInfo).port;
    try {
      const d = spawn(PY, [DELIVER_PATH, '--code', path.join(dir, 'code', 'main.py'), '--input', path.join(dir, 'input', 'data.json'), '--go-port', String(port), '--release', path.join(dir, 'control', 'release'), '--output', path.join(dir, 'out')], { env: CLEAN, stdio: ['pipe', 'pipe', 'pipe'] });
      children.push(d);
      const deliver = collect(d);
      d.stdin!.write(handOverPayload({ code: 'print(1)', inputJson: '{}', timeoutSec: 10, maxStdoutBytes: 1000 }));
      await until(() => deliver.raw().includes('done 0\n'));
      const { lines, output } = await readCollector(deliver.raw());
      expect(lines).toEqual(['ready', 'execution', 'outputs-end ok', 'done 0']);
      expect(output!.stdout).toBe('from the directory\n');
      expect(output!.artifacts.map((a) => a.name)).toEqual(['left.bin']);
    } finally {
      server.close();
    }
  });

  it('a pod fenced by a run\'s new holder (FENCE_COMMAND, exit 0) runs nothing of a hand-over that comes after: deliver says so and exits 4', async () => {
    const p = await pair('deliver-fenced-');
    expect(await fence(p.dir)).toBe(0);
    // Fenced already: the same answer to a second new holder.
    expect(await fence(p.dir)).toBe(0);
    p.deliverProc.stdin!.write(handOverPayload({ code: 'open("ran", "w").write("x")\n', inputJson: '{}', timeoutSec: 10, maxStdoutBytes: 1000 }));
    expect(await p.deliver.exited).toBe(4);
    expect(p.deliver.out()).toBe('undelivered fenced: the run has a new holder, which took this pod before the program started\n');
    // The runner saw its go connection end without a go line: it exits, nothing ran.
    expect(await p.runner.exited).toBe(RUNNER_NOT_DELIVERED_EXIT);
    expect(existsSync(path.join(p.dir, 'ran'))).toBe(false);
  });

  it('once the program was handed over, the fence is refused (exit 17): the new holder re-attaches to the run', async () => {
    const p = await pair('deliver-claimed-');
    p.deliverProc.stdin!.write(handOverPayload({ code: 'print("once")\n', inputJson: '{}', timeoutSec: 10, maxStdoutBytes: 1000 }));
    expect(await p.runner.exited).toBe(0);
    expect(await fence(p.dir)).toBe(17);
    expect(p.runner.out()).toBe('once\n');
  });

  it('a stream that ends mid-payload sends no go line: nothing runs, and the runner still waits', async () => {
    const p = await pair('deliver-cut-');
    const full = handOverPayload({ code: 'open("ran", "w").write("x")\n', inputJson: '{}', timeoutSec: 10, maxStdoutBytes: 1000 });
    p.deliverProc.stdin!.end(full.subarray(0, full.length - 5));
    await new Promise((r) => setTimeout(r, 1500));
    expect(p.runnerProc.exitCode).toBeNull();
    expect(p.deliver.out()).toBe('');
    expect(existsSync(path.join(p.dir, 'ran'))).toBe(false);
  });

  it('a stdin that ends before its first byte: deliver says so and exits 3 (no program can come any more); the runner still waits', async () => {
    const p = await pair('deliver-gone-');
    p.deliverProc.stdin!.end();
    expect(await p.deliver.exited).toBe(3);
    expect(p.deliver.out()).toBe('undelivered stdin closed before the program came\n');
    expect(p.runnerProc.exitCode).toBeNull();
  });

  it('a stream cut after its first bytes is a failed hand-over, not a dead stdin: deliver stays as the collector', async () => {
    const p = await pair('deliver-partial-');
    p.deliverProc.stdin!.end('{"code": 5');
    await new Promise((r) => setTimeout(r, 1500));
    expect(p.deliverProc.exitCode).toBeNull();
    expect(p.deliver.out()).toBe('');
  });

  it('the runner exits 123 when the go connection closes before a go line', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'deliver-eof-'));
    mkdirSync(path.join(dir, 'out'));
    const port = await freePort();
    const r = spawn(PY, [RUNNER_PATH, '--code', path.join(dir, 'main.py'), '--output', path.join(dir, 'out'), '--wait', '--go-port', String(port)], { env: CLEAN, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(r);
    const runner = collect(r);
    const { connect } = await import('node:net');
    let sock: import('node:net').Socket | null = null;
    await until(() => {
      if (sock) return true;
      const s = connect(port, '127.0.0.1');
      s.on('connect', () => (sock = s));
      s.on('error', () => undefined);
      return false;
    });
    sock!.end();
    expect(await runner.exited).toBe(RUNNER_NOT_DELIVERED_EXIT);
    expect(runner.out()).toBe('');
  });
});
