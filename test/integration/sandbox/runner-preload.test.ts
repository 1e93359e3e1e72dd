/**
 * runner.py's warm-sandbox options for real work, driven directly with the system Python:
 * `--preload` (imports before the go line; a failing module is logged and skipped, the program gets
 * the real error) and the go line's `proxy` (a per-run proxy URL set at the go, never at start), and
 * `--wait` with `--egress-proxy` (the relay starts at the go).
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { RUNNER_PATH } from '../../../src/sandbox/paths.ts';
import { UDS_ECHO } from '../../support/uds-echo.ts';

const PY = '/usr/bin/python3';
const CLEAN = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', TMPDIR: '/tmp', LANG: 'C.UTF-8' };

/** Starts a `--wait` runner with `args`, writes `code` once it is ready, sends `goLine`; its result. */
async function waitRun(code: string, args: string[], goLine = '{}', onReady?: () => void) {
  mkdirSync('/tmp/sandpod-test', { recursive: true });
  const dir = mkdtempSync(path.join('/tmp/sandpod-test', 'runner-preload-'));
  mkdirSync(path.join(dir, 'out'));
  const main = path.join(dir, 'main.py');
  const child = spawn(PY, [RUNNER_PATH, '--code', main, '--output', path.join(dir, 'out'), '--cwd', dir, '--phase-fd', '1', '--timeout', '60', '--wait', ...args], { env: CLEAN, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr.on('data', (b: Buffer) => (err += b.toString()));
  const exited = new Promise<number | null>((r) => child.on('close', (c) => r(c)));
  for (let i = 0; i < 1200 && !out.includes('ready\n') && child.exitCode === null; i++) await new Promise((r) => setTimeout(r, 25));
  onReady?.();
  // The program exists only after ready, as a warm sandbox's host writes it at claim.
  writeFileSync(main, code);
  child.stdin.end(`${goLine}\n`);
  const status = await exited;
  const read = (n: string) => readFileSync(path.join(dir, 'out', n), 'utf8');
  return { status, out, err, stdout: () => read('.svc_stdout'), stderr: () => read('.svc_stderr'), dir };
}

describe('runner.py --preload and the go line proxy', () => {
  it('imports the modules before the go line; a failing one is logged to the runner’s stderr and skipped, and the program gets the real error', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const lib = mkdtempSync(path.join('/tmp/sandpod-test', 'preload-lib-'));
    writeFileSync(path.join(lib, 'noisy.py'), 'import sys\nprint("noise out")\nprint("noise err", file=sys.stderr)\nLOADED = 1\n');
    writeFileSync(path.join(lib, 'bad.py'), 'import sys\nprint("half")\nimport half_helper\nraise ValueError("boom")\n');
    writeFileSync(path.join(lib, 'half_helper.py'), 'X = 1\n');
    const code = `
import sys
print(sorted(m for m in ('json', 'noisy', 'bad', 'half_helper', 'nosuchmod', 'xml.dom') if m in sys.modules))
for name in ('bad', 'nosuchmod'):
    try:
        __import__(name)
    except Exception as e:
        print(name, type(e).__name__, e)
`;
    const r = await waitRun(code, ['--preload', 'json,noisy,bad', '--preload=nosuchmod,xml.dom', '--python-path', lib]);
    expect(r.status).toBe(0);
    expect(r.out).toBe('ready\nexecution\ndone 0\n');
    // Loaded before the program: json, noisy, xml.dom; bad (and what it half-imported) dropped.
    // Importing bad again runs it again (its "half" is the program's output now) and raises the real error.
    expect(r.stdout()).toBe("['json', 'noisy', 'xml.dom']\nhalf\nbad ValueError boom\nnosuchmod ModuleNotFoundError No module named 'nosuchmod'\n");
    // What the preload printed is the runner's log, never the program's streams.
    expect(r.stderr()).toBe('');
    expect(r.err).toContain('noise out');
    expect(r.err).toContain('noise err');
    expect(r.err).toContain('sandpod runner: preload of bad failed, skipped: ValueError: boom');
    expect(r.err).toContain("sandpod runner: preload of nosuchmod failed, skipped: ModuleNotFoundError: No module named 'nosuchmod'");
  });

  it('says ready only once the preload is done, so a claim never waits for the imports', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const lib = mkdtempSync(path.join('/tmp/sandpod-test', 'preload-slow-'));
    const mark = path.join(lib, 'imported');
    writeFileSync(path.join(lib, 'slow.py'), `import time\ntime.sleep(1.5)\nopen(${JSON.stringify(mark)}, 'w').write('x')\n`);
    let atReady: boolean | null = null;
    const r = await waitRun('print(1)\n', ['--preload', 'slow', '--python-path', lib], '{}', () => {
      atReady = existsSync(mark);
    });
    expect(r.status).toBe(0);
    expect(atReady).toBe(true);
  });

  it('freezes what the preload built, so collections walk only the program’s objects, and still finalizes the program’s own at exit', async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const lib = mkdtempSync(path.join('/tmp/sandpod-test', 'preload-many-'));
    writeFileSync(path.join(lib, 'many.py'), 'HELD = [[i] for i in range(20000)]\n');
    // A cycle with a finalizer, left for the exit: its __del__ writes a file the test reads.
    const mark = path.join(lib, 'finalized');
    const code = `
import gc, many
print(gc.get_freeze_count() >= 20000, len(gc.get_objects()) < 20000)
class C:
    def __del__(self):
        open(${JSON.stringify(mark)}, 'w').write('yes')
c = C(); c.self = c; del c
`;
    const r = await waitRun(code, ['--preload', 'many', '--python-path', lib]);
    expect(r.status).toBe(0);
    expect(r.stdout()).toBe('True True\n');
    expect(readFileSync(mark, 'utf8')).toBe('yes');
  });

  it('the program holds no more fds with --preload than without (the runner’s log fd is closed)', async () => {
    // The highest is the directory listdir reads (its number depends on what was closed before).
    const code = 'import os\nprint(sorted(int(f) for f in os.listdir("/proc/self/fd"))[:-1])\n';
    const r = await waitRun(code, ['--preload', 'json']);
    expect(r.status).toBe(0);
    expect(r.stdout()).toBe((await waitRun(code, [])).stdout());
  });

  it('--preload needs --wait', () => {
    const r = spawnSync(PY, [RUNNER_PATH, '--code', '/nonexistent.py', '--preload', 'json'], { env: CLEAN, encoding: 'utf8', timeout: 20_000 });
    expect(r.status).toBe(125);
    expect(r.stderr).toContain('--preload needs --wait');
  });

  it('the go line’s proxy becomes the program’s proxy variables at the go; without one there are none', async () => {
    const code = 'import json, os\nprint(json.dumps(sorted([k, v] for k, v in os.environ.items() if "proxy" in k.lower())))\n';
    const url = 'http://run-7:c2VjcmV0@10.0.0.9:3128';
    const r = await waitRun(code, ['--env', 'NO_PROXY=*'], JSON.stringify({ proxy: url }));
    expect(r.status).toBe(0);
    const vars = ['ALL_PROXY', 'HTTPS_PROXY', 'HTTP_PROXY', 'all_proxy', 'http_proxy', 'https_proxy'];
    expect(JSON.parse(r.stdout())).toEqual(vars.map((k) => [k, url]));
    const none = await waitRun(code, []);
    expect(JSON.parse(none.stdout())).toEqual([]);
  });

  it('a go line whose proxy is not one line of text is refused and nothing runs', async () => {
    for (const proxy of ['http://a\nb', 5, '']) {
      const r = await waitRun('open("ran", "w").write("x")\n', [], JSON.stringify({ proxy }));
      expect(r.status, String(proxy)).toBe(125);
      expect(() => readFileSync(path.join(r.dir, 'ran'))).toThrow();
    }
  });

  it('--wait --egress-proxy: the relay serves the program after the go', async () => {
    const sock = path.join(mkdtempSync(path.join('/tmp/sandpod-test', 'uds-')), 'proxy.sock');
    const server = spawn(PY, ['-c', UDS_ECHO, sock], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => server.stdout!.once('data', () => resolve()));
    try {
      const code = "import urllib.request\nprint(urllib.request.urlopen('http://api.example.test/x', timeout=10).read().decode())\n";
      const r = await waitRun(code, ['--egress-proxy', sock, '--preload', 'urllib.request']);
      expect(r.stderr()).toBe('');
      expect(r.stdout()).toBe('via uds: GET http://api.example.test/x HTTP/1.1\n');
      expect(r.status).toBe(0);
    } finally {
      server.kill();
    }
  });

  it('answers each `ping` before the go line with `ready` (a restored sandbox), then runs the go line as usual', async () => {
    const r = await waitRun('print("ran")\n', ['--preload', 'json'], 'ping\nping\n{}');
    expect(r.status).toBe(0);
    expect(r.out).toBe('ready\nready\nready\nexecution\ndone 0\n');
    expect(r.stdout()).toBe('ran\n');
  });

  it('reseeds random and tempfile names at the go, so sandboxes restored from one checkpoint do not share them', async () => {
    // The preload seeds `random` and draws from it; the program must not see the continuation of
    // that sequence (which a restored copy of this process would share with every other copy).
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const lib = mkdtempSync(path.join('/tmp/sandpod-test', 'preload-seed-'));
    writeFileSync(path.join(lib, 'seeded.py'), 'import random, tempfile\nrandom.seed(42)\nrandom.random()\nNAMES = next(tempfile._get_candidate_names())\n');
    const code = 'import random, tempfile\nprint(random.random())\nprint(next(tempfile._get_candidate_names()))\n';
    const r = await waitRun(code, ['--preload', 'seeded', '--python-path', lib]);
    expect(r.status).toBe(0);
    const [drawn, name] = r.stdout().trim().split('\n');
    const py = spawnSync(PY, ['-c', 'import random, tempfile\nrandom.seed(42)\nrandom.random()\nprint(random.random())\ng = tempfile._get_candidate_names()\nnext(g)\nprint(next(g))'], { encoding: 'utf8' });
    const [continued] = py.stdout.trim().split('\n');
    expect(Number(drawn)).not.toBe(Number(continued));
    expect(name).toMatch(/^\w{8}$/);
  });
});
