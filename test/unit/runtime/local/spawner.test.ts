import { chmodSync, mkdtempSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Spawner, type SpawnedProc } from '../../../../src/runtime/local/spawner.ts';

const problems: string[] = [];
const spawner = new Spawner('/usr/bin/python3', (m) => problems.push(m));
afterAll(() => spawner.stop());

const SH = '/bin/sh';
const ENV = { PATH: '/usr/bin:/bin' };

async function run(p: SpawnedProc, script: string, env: Record<string, string> = ENV, cwd?: string) {
  let out = '';
  let err = '';
  p.onStdout((b) => (out += b.toString('utf8')));
  p.onStderr((b) => (err += b.toString('utf8')));
  p.launch({ file: SH, args: ['-c', script], env, cwd });
  const [code, sig, error] = await p.closed;
  return { out, err, code, sig, error };
}

describe('Spawner', () => {
  it('execs the command with exactly its environment, stdin /dev/null, stdout/stderr captured', async () => {
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null })!;
    const r = await run(p, 'env | sort; read x || echo eof; echo oops >&2; exit 3', { PATH: '/usr/bin:/bin', FOO: 'bär' });
    // (sh itself adds PWD.)
    expect(r.out.split('\n').filter((l) => !l.startsWith('PWD='))).toEqual(['FOO=bär', 'PATH=/usr/bin:/bin', 'eof', '']);
    expect(r.err).toBe('oops\n');
    expect([r.code, r.sig, r.error]).toEqual([3, null, null]);
  });

  it('with stdin: the command reads the one message input() writes, then EOF; no other fd of it leaks', async () => {
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null, stdin: true })!;
    let out = '';
    p.onStdout((b) => (out += b.toString('utf8')));
    p.launch({ file: SH, args: ['-c', 'echo ready; read line; echo "got $line"; read more || echo eof; ls /proc/$$/fd'], env: ENV });
    while (!out.includes('ready')) await new Promise((r) => setTimeout(r, 10));
    p.input('go {"timeout": 1}\n');
    const [code] = await p.closed;
    const lines = out.split('\n');
    expect(lines.slice(0, 3)).toEqual(['ready', 'got go {"timeout": 1}', 'eof']);
    expect(lines.slice(3).filter((l) => l !== '').map(Number).filter((n) => n < 10).sort((a, b) => a - b)).toEqual([0, 1, 2]);
    expect(code).toBe(0);
  });

  it('with fifos: the one message and stdout pass through named pipes the service holds, no spawner in between', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'spawner-'));
    const fifos = { in: path.join(dir, 'go.fifo'), out: path.join(dir, 'out.fifo') };
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null, fifos })!;
    let out = '';
    let err = '';
    p.onStdout((b) => (out += b.toString('utf8')));
    p.onStderr((b) => (err += b.toString('utf8')));
    // The launch is sent before the child exists; it waits until the service opened its ends.
    p.launch({ file: SH, args: ['-c', 'echo ready; read line; echo "got $line"; read more || echo eof; readlink /proc/$$/fd/0 /proc/$$/fd/1; echo to-stderr >&2'], env: ENV });
    while (!out.includes('ready')) await new Promise((r) => setTimeout(r, 10));
    expect(statSync(fifos.in).isFIFO() && statSync(fifos.out).isFIFO()).toBe(true);
    expect(statSync(fifos.in).mode & 0o777).toBe(0o600);
    p.input('go {"timeout": 1}\n');
    // A second message has nowhere to go (one message, once) and is dropped without an error.
    p.input('again\n');
    const [code, sig, error] = await p.closed;
    // fds 0 and 1 are the named pipes themselves (a pipe of the spawner's would read `pipe:[…]`).
    expect(out.split('\n')).toEqual(['ready', 'got go {"timeout": 1}', 'eof', fifos.in, fifos.out, '']);
    expect(err).toBe('to-stderr\n');
    expect([code, sig, error]).toEqual([0, null, null]);
  });

  it('with fifos: a child that dies before its message is reported, and the message is dropped', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'spawner-'));
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null, fifos: { in: path.join(dir, 'i'), out: path.join(dir, 'o') } })!;
    let out = '';
    p.onStdout((b) => (out += b.toString('utf8')));
    p.launch({ file: SH, args: ['-c', 'echo bye; exit 7'], env: ENV });
    const [code] = await p.closed;
    expect(() => p.input('late\n')).not.toThrow();
    expect([code, out]).toEqual([7, 'bye\n']);
  });

  it('with fifos whose paths cannot be made: the child is reported as not started', async () => {
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null, fifos: { in: '/nonexistent/dir/i', out: '/nonexistent/dir/o' } })!;
    p.launch({ file: SH, args: ['-c', 'exit 0'], env: ENV });
    const [code, sig, error] = await p.closed;
    expect([code, sig]).toEqual([null, null]);
    expect(error).toMatch(/cannot start: .*No such file or directory/);
  });

  it('reports a signal death, the working directory, and opens fd files as fds 3…', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'spawner-'));
    const f = path.join(dir, 'blob');
    writeFileSync(f, 'from fd 3');
    const p = spawner.warm({ procsFiles: [], fdFiles: [f], drop: null })!;
    // No pipeline: while `ls` reads the shell's fd table, the shell must hold no pipe of its own.
    const r = await run(p, 'cat <&3; echo; pwd; ls /proc/$$/fd; kill -9 $$', ENV, dir);
    const fdLines = r.out.split('\n').slice(2).filter((l) => l !== '');
    expect(r.out.startsWith(`from fd 3\n${dir}\n`)).toBe(true);
    // 0, 1, 2 and 3, and nothing of the spawner leaks in (sh keeps its own at 10 and above).
    expect(fdLines.map(Number).filter((n) => n < 10).sort((a, b) => a - b)).toEqual([0, 1, 2, 3]);
    expect([r.code, r.sig]).toEqual([null, 'SIGKILL']);
  });

  it('kills a warm child that never got a command, and the whole process group of a running one', async () => {
    const idle = spawner.warm({ procsFiles: [], fdFiles: [], drop: null })!;
    idle.kill();
    expect((await idle.closed)[1]).toBe('SIGKILL');
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null })!;
    let out = '';
    p.onStdout((b) => (out += b.toString()));
    p.launch({ file: SH, args: ['-c', 'sleep 30 & echo started; wait'], env: ENV });
    while (!out.includes('started')) await new Promise((r) => setTimeout(r, 10));
    p.kill();
    const [code, sig] = await p.closed;
    expect([code, sig]).toEqual([null, 'SIGKILL']);
  });

  it('a command that cannot be executed exits 127 with the reason on stderr', async () => {
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null })!;
    let err = '';
    p.onStderr((b) => (err += b.toString()));
    p.launch({ file: '/nonexistent/program', args: [], env: ENV });
    expect((await p.closed)[0]).toBe(127);
    expect(err).toMatch(/cannot start/);
  });

  it('with caps, a relay passes on at most that much of each stream, drains the rest and ends as the command did', async () => {
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: null })!;
    let out = '';
    let err = '';
    p.onStdout((b) => (out += b.toString()));
    p.onStderr((b) => (err += b.toString()));
    p.launch({ file: SH, args: ['-c', 'head -c 3000000 /dev/zero | tr "\\0" x; echo 123456789 >&2; exit 5'], env: ENV, caps: [10, 4] });
    expect(await p.closed).toEqual([5, null, null]);
    expect([out, err]).toEqual(['x'.repeat(10), '1234']);
    const k = spawner.warm({ procsFiles: [], fdFiles: [], drop: null })!;
    k.launch({ file: SH, args: ['-c', 'kill -TERM $$'], env: ENV, caps: [10, 10] });
    expect((await k.closed).slice(0, 2)).toEqual([null, 'SIGTERM']);
  });

  it.runIf(process.getuid?.() === 0)('drops root like setpriv: uid/gid 1000, no groups, no capabilities, no_new_privs', async () => {
    const p = spawner.warm({ procsFiles: [], fdFiles: [], drop: { uid: 1000, gid: 1000 } })!;
    const r = await run(p, 'id -u; id -g; id -G; grep -E "^(Cap(Inh|Prm|Eff|Amb)|NoNewPrivs)" /proc/self/status');
    expect(r.out).toBe('1000\n1000\n1000\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n');
  });

  it('fds the service inherited without close-on-exec never reach a command', async () => {
    // What a CI harness or a shell redirect does: the spawner's parent holds fds 5, 6 and 9 that are
    // not close-on-exec (a wrapper opens them, then execs Python).
    const dir = mkdtempSync(path.join(tmpdir(), 'spawner-leak-'));
    const marker = path.join(dir, 'leak-marker');
    writeFileSync(marker, 'secret');
    const wrapper = path.join(dir, 'python');
    writeFileSync(wrapper, `#!/bin/sh\nexec 5<${marker} 6<${marker} 9<${marker}\nexec /usr/bin/python3 "$@"\n`);
    chmodSync(wrapper, 0o755);
    const leakyProblems: string[] = [];
    const leaky = new Spawner(wrapper, (m) => leakyProblems.push(m));
    try {
      const p = leaky.warm({ procsFiles: [], fdFiles: [], drop: null })!;
      const r = await run(p, 'ls -l /proc/$$/fd');
      const fds = [...r.out.matchAll(/ (\d+) -> (.*)$/gm)].map((m) => [m[1]!, m[2]!]);
      expect(fds.map(([n]) => Number(n)).filter((n) => n < 10).sort((a, b) => a - b)).toEqual([0, 1, 2]);
      expect(fds.filter(([, link]) => link?.includes('leak-marker'))).toEqual([]);
      expect(leakyProblems).toEqual([]);
    } finally {
      await leaky.stop();
    }
  });

  it('a child that cannot enter its cgroup exits 199 and runs nothing', async () => {
    const p = spawner.warm({ procsFiles: ['/nonexistent/cgroup.procs'], fdFiles: [], drop: null })!;
    const r = await run(p, 'echo ran');
    expect(r.code).toBe(199);
    expect(r.out).toBe('');
    expect(problems).toEqual([]);
  });
});
