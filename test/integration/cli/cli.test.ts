/**
 * The `sandpod` command as a real subprocess (the package's bin, src/cli/sandpod.js) against a real
 * listening service (real database, real sandbox): exit codes, `--json` answers parsed, output live
 * and in order, artifacts downloaded, one-line errors for an error body, an unreachable service and a
 * missing token, and the spinner only on a terminal.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { useServedService } from '../../support/service.ts';

const BIN = path.resolve('src/cli/sandpod.js');
const TOKEN = 'cli-test-token-0123456789abcdef';
const dir = mkdtempSync(path.join(tmpdir(), 'sandpod-cli-'));

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `sandpod args…` to its end. `onStdout` sees each chunk as it arrives. */
function sandpod(args: string[], env: Record<string, string | undefined> = {}, onStdout?: (all: string) => void): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], {
      cwd: dir,
      env: { ...process.env, SANDPOD_URL: undefined, SANDPOD_TOKEN: undefined, NO_COLOR: '1', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      stdout += d;
      onStdout?.(stdout);
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

function file(name: string, text: string): string {
  const p = path.join(dir, name);
  writeFileSync(p, text);
  return p;
}


describe('sandpod against a running service', () => {
  const served = useServedService();
  let env: Record<string, string>;
  let hasEvents = false;
  beforeAll(async () => {
    env = { SANDPOD_URL: served.url };
    const probe = (await (await served.svc.get('/jobs/00000000-0000-4000-8000-000000000000/events')).json()) as { detail: string };
    hasEvents = !probe.detail.startsWith('no route');
  });

  it('run: prints stdout and stderr and exits with the program\'s exit code', async () => {
    const prog = file('exit3.py', 'import sys\nfor i in range(5):\n    print(f"line {i}", flush=True)\nprint("to stderr", file=sys.stderr)\nsys.exit(3)\n');
    const r = await sandpod(['run', prog], env);
    expect(r.code).toBe(3);
    expect(r.stdout).toBe('line 0\nline 1\nline 2\nline 3\nline 4\n');
    expect(r.stderr).toContain('to stderr\n');
    // Not a terminal: no spinner, no escape sequences.
    expect(r.stderr).not.toContain('\x1b[');
    const ok = await sandpod(['run', file('ok.py', 'print("fine")\n')], env);
    expect(ok).toMatchObject({ code: 0, stdout: 'fine\n' });
  });

  it('run --json: the full record on stdout; --input @file reaches the program with its numbers exact', async () => {
    const input = file('in.json', '{"n": 12345678901234567890123, "x": 0.1000000000000000055511151231257827}');
    const prog = file('echo.py', 'import json\nd = json.load(open("/input/data.json"))\nprint(d["n"])\njson.dump({"n": d["n"]}, open("/output/result.json", "w"))\n');
    const r = await sandpod(['--json', 'run', prog, '--input', `@${input}`], env);
    expect(r.code, r.stderr).toBe(0);
    const record = JSON.parse(r.stdout) as { status: string; exit_code: number; stdout: string; job_id: string };
    expect(record.status).toBe('succeeded');
    expect(record.exit_code).toBe(0);
    expect(record.stdout).toBe('12345678901234567890123\n');
    // The record is printed with the service's own number texts, not JSON.parse's doubles.
    expect(r.stdout).toContain('"n": 12345678901234567890123');
    expect(r.stdout).toContain('"x": 0.1000000000000000055511151231257827');
    const bad = await sandpod(['run', prog, '--input', '{"n": '], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^sandpod: --input is not valid JSON/);
    const missing = await sandpod(['run', path.join(dir, 'nope.py')], env);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/cannot read .*nope\.py/);
  });

  it('run --async, result, logs, jobs, artifacts, rerun', async () => {
    const prog = file('art.py', 'import json\nprint("made it")\nopen("/output/a.txt", "w").write("artifact text")\njson.dump({"k": 1}, open("/output/result.json", "w"))\n');
    const sub = await sandpod(['--json', 'run', '--async', prog], env);
    expect(sub.code, sub.stderr).toBe(0);
    const { job_id: id, status } = JSON.parse(sub.stdout) as { job_id: string; status: string };
    expect(status).toBe('pending');

    const res = await sandpod(['--json', 'result', id, '--wait', '--timeout', '60'], env);
    expect(res.code, res.stderr).toBe(0);
    expect(JSON.parse(res.stdout)).toMatchObject({ job_id: id, status: 'succeeded', output: { k: 1 } });
    const human = await sandpod(['result', id], env);
    expect(human.stdout).toMatch(/^status\s+succeeded \(exit 0\)/m);
    expect(human.stdout).toMatch(/^artifacts\s+a\.txt/m);

    const logs = await sandpod(['logs', id], env);
    expect(logs).toMatchObject({ code: 0, stdout: 'made it\n' });

    const jobs = await sandpod(['--json', 'jobs', '--limit', '50'], env);
    const page = JSON.parse(jobs.stdout) as { items: { job_id: string }[] };
    expect(page.items.map((i) => i.job_id)).toContain(id);
    const table = await sandpod(['jobs'], env);
    expect(table.stdout.split('\n')[0]).toMatch(/^JOB ID\s+STATUS\s+TYPE/);
    expect(table.stdout).toContain(id);

    const list = await sandpod(['--json', 'artifacts', id], env);
    expect((JSON.parse(list.stdout) as { name: string }[]).map((a) => a.name)).toContain('a.txt');
    const out = path.join(dir, 'downloads');
    const dl = await sandpod(['artifacts', id, 'a.txt', '-o', out], env);
    expect(dl.code, dl.stderr).toBe(0);
    expect(readFileSync(path.join(out, 'a.txt'), 'utf8')).toBe('artifact text');
    const none = await sandpod(['artifacts', id, 'missing.txt'], env);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain("no artifact 'missing.txt'");

    const rerun = await sandpod(['rerun', id, '--follow'], env);
    expect(rerun).toMatchObject({ code: 0, stdout: 'made it\n' });
  });

  it('result and artifacts say when /output held more than the record lists', async () => {
    const prog = file('many.py', 'for i in range(1003):\n    open(f"/output/f{i:04d}.txt", "w").write("x")\n');
    const id = (await sandpod(['run', '--async', prog], env)).stdout.trim();
    const res = await sandpod(['result', id, '--wait', '--timeout', '60'], env);
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toMatch(/^artifacts\s+f0000\.txt, .*f0999\.txt \(and 3 more entries of \/output not listed\)$/m);
    const list = await sandpod(['artifacts', id], env);
    expect(list.code, list.stderr).toBe(0);
    expect(list.stdout).toContain('f0999.txt');
    expect(list.stdout).not.toContain('f1000.txt');
    expect(list.stderr).toContain('only these are listed: 3 more entries of /output not listed');
  }, 120_000);

  it('cancel: a running job is cancelled, and `run` reports it with exit code 130', async () => {
    const prog = file('long.py', 'import time\nprint("started", flush=True)\ntime.sleep(60)\n');
    const sub = await sandpod(['run', '--async', prog], env);
    const id = sub.stdout.trim();
    // Wait until it runs (the long-poll of the result says so), then cancel.
    for (;;) {
      const s = (await (await served.svc.get(`/jobs/${id}`)).json()) as { status: string };
      if (s.status === 'running') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const following = sandpod(['logs', id, '-f'], env);
    const c = await sandpod(['cancel', id], env);
    expect(c.code, c.stderr).toBe(0);
    expect(c.stdout).toMatch(new RegExp(`^${id} cancel(led|ling) \\(was running\\)`));
    const f = await following;
    expect(f.code).toBe(0);
    const again = await sandpod(['--json', 'result', id, '--wait'], env);
    expect(JSON.parse(again.stdout)).toMatchObject({ status: 'cancelled' });
  });

  it('run shows output live, before the program ends (with the event stream)', async (t) => {
    if (!hasEvents) t.skip(); // the service of this branch has no GET /jobs/{id}/events yet
    const prog = file('live.py', 'import time\nprint("first", flush=True)\ntime.sleep(60)\nprint("never")\n');
    let sawFirstWhileRunning: Promise<boolean> | null = null;
    const r = await sandpod(['run', prog], env, (all) => {
      if (sawFirstWhileRunning || !all.includes('first\n')) return;
      sawFirstWhileRunning = (async () => {
        const page = (await (await served.svc.get('/executions?status=running')).json()) as { items: { job_id: string }[] };
        const running = page.items.length === 1;
        for (const i of page.items) await served.svc.post(`/jobs/${i.job_id}/cancel`);
        return running;
      })();
    });
    expect(await sawFirstWhileRunning).toBe(true);
    expect(r.stdout).toBe('first\n');
    expect(r.code).toBe(130);
    expect(r.stderr).toMatch(/cancelled/);
  });

  it('errors are one line with the detail and the code, exit 3', async () => {
    const r = await sandpod(['result', '00000000-0000-4000-8000-000000000000'], env);
    expect(r.code).toBe(3);
    expect(r.stdout).toBe('');
    expect(r.stderr).toMatch(/^sandpod: .*not found.* \[not_found\]\n$/);
    const v = await sandpod(['run', file('t.py', 'print(1)\n'), '--timeout', '100000'], env);
    expect(v.code).toBe(3);
    expect(v.stderr).toMatch(/^sandpod: .*timeout.* \[validation_error\]\n$/);
    // --callback-url reaches the service (callbacks are off here: every URL is refused).
    const w = await sandpod(['run', '--async', '--callback-url', 'https://hooks.example.com/x', file('t.py', 'print(1)\n')], env);
    expect(w.code).toBe(3);
    expect(w.stderr).toMatch(/^sandpod: callback_url: callbacks are not enabled on this service .* \[validation_error\]\n$/);
  });

  it('job-types and build', async () => {
    const types = await sandpod(['--json', 'job-types'], env);
    expect((JSON.parse(types.stdout) as { name: string }[]).map((t) => t.name)).toContain('default');
    const b = await sandpod(['--json', 'build', 'default'], env);
    expect(b.code, b.stderr).toBe(0);
    expect(JSON.parse(b.stdout)).toMatchObject({ job_type: 'default', status: 'built' });
    const unknown = await sandpod(['build', 'no-such-type'], env);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toMatch(/\[not_found\]/);
  });

  it('shows a spinner on a terminal only', async () => {
    const prog = file('tty.py', 'print("on a tty")\n');
    // Not spawnSync: the service answers from this very process.
    const r = await new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve, reject) => {
      // A person's terminal: without CI in the environment (ora, like most tools, never animates under CI).
      const { CI: _ci, ...terminalEnv } = process.env;
      const child = spawn('/usr/bin/python3', ['-c', PTY_RUN, process.execPath, BIN, 'run', prog], { env: { ...terminalEnv, SANDPOD_URL: served.url } });
      let stdout = '';
      let stderr = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
      child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
      child.on('error', reject);
      child.on('close', (status) => resolve({ status, stdout, stderr }));
    });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('on a tty\r\n');
    expect(r.stdout).toContain('\x1b[?25l'); // ora hides the cursor while it spins
    expect(r.stdout).toMatch(/✔(\x1b\[\d+m)? \S+ succeeded \(exit 0\)/);
  });
});

/** Runs argv[1:] on a pseudo-terminal (80 columns), copies what it writes to stdout, exits with its status. */
const PTY_RUN = `
import fcntl, os, pty, struct, sys, termios
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 80, 0, 0))
out = b''
while True:
    try:
        d = os.read(fd, 65536)
    except OSError:
        break
    if not d:
        break
    out += d
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode('utf8', 'replace'))
sys.exit(os.waitstatus_to_exitcode(status))
`;

describe('sandpod without a service or a token', () => {
  it('an unreachable service: one line naming the address, exit 3', async () => {
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
    const { port } = probe.address() as AddressInfo;
    await new Promise((r) => probe.close(r));
    const r = await sandpod(['jobs', '--url', `http://127.0.0.1:${port}`]);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(new RegExp(`^sandpod: cannot reach the service at http://127\\.0\\.0\\.1:${port}: .*ECONNREFUSED.*\\n$`));
    const viaEnv = await sandpod(['run', file('u.py', 'print(1)\n')], { SANDPOD_URL: `http://127.0.0.1:${port}` });
    expect(viaEnv.code).toBe(3);
    expect(viaEnv.stderr.split('\n').filter(Boolean)).toHaveLength(1);
  });

  describe('with auth on', () => {
    const authed = useServedService({ sandbox_engine: 'process', auth: { tokens: [TOKEN] } });

    it('401 without a token (exit 3, a hint), works with SANDPOD_TOKEN or --token', async () => {
      const r = await sandpod(['job-types'], { SANDPOD_URL: authed.url });
      expect(r.code).toBe(3);
      expect(r.stderr).toMatch(/^sandpod: .* \[unauthorized\] \(pass --token or set SANDPOD_TOKEN\)\n$/);
      const env = await sandpod(['--json', 'job-types'], { SANDPOD_URL: authed.url, SANDPOD_TOKEN: TOKEN });
      expect(env.code, env.stderr).toBe(0);
      const flag = await sandpod(['run', file('a.py', 'print("authed")\n'), '--token', TOKEN, '--url', authed.url]);
      expect(flag).toMatchObject({ code: 0, stdout: 'authed\n' });
    });
  });
});
