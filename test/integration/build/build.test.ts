/**
 * The production build works as the service image uses it: `npm run build` turns src/ into dist/
 * (JavaScript importing JavaScript, plus the files the code reads next to itself), and plain
 * `node dist/store/migrate.js` and `node dist/main.js` — no tsx — migrate, serve /health and run
 * code in a real sandbox, on PGlite in a temporary workspace.
 *
 * The build runs in a copy of the package (package.json, tsconfigs, src/, node_modules linked) in a
 * temporary directory, so it never races other tests over the repository's dist/.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { unmountUnder } from '../../support/db.ts';
import { freePort } from '../../support/process.ts';

const ROOT = path.resolve(import.meta.dirname, '../../..');
const PKG = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string; scripts: Record<string, string> };

let dir: string;
let dist: string;
let build: { status: number | null; output: string };

beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'sandpod-build-'));
  chmodSync(dir, 0o755); // the sandbox user (uid 1000) must reach the workspace below it
  for (const f of ['package.json', 'tsconfig.json', 'tsconfig.build.json']) cpSync(path.join(ROOT, f), path.join(dir, f));
  cpSync(path.join(ROOT, 'src'), path.join(dir, 'src'), { recursive: true, filter: (f) => !f.includes('__pycache__') });
  symlinkSync(realpathSync(path.join(ROOT, 'node_modules')), path.join(dir, 'node_modules'));
  const r = spawnSync('npm', ['run', 'build'], { cwd: dir, encoding: 'utf8', timeout: 240_000 });
  build = { status: r.status, output: `${r.stdout}${r.stderr}` };
  dist = path.join(dir, 'dist');
}, 300_000);

afterAll(() => {
  if (!dir) return;
  unmountUnder(dir);
  rmSync(dir, { recursive: true, force: true });
});

/** Regular files below `root`, as relative paths (Python caches left out). */
function filesUnder(root: string): string[] {
  return readdirSync(root, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => path.relative(root, path.join(e.parentPath, e.name)))
    .filter((f) => !f.includes('__pycache__'))
    .sort();
}

describe('npm run build', () => {
  it('succeeds and mirrors src/: every .ts becomes a .js, every other runtime file is copied', () => {
    expect(build, build.output).toMatchObject({ status: 0 });
    const src = filesUnder(path.join(dir, 'src'));
    expect(src).toContain('main.ts');
    const out = new Set(filesUnder(dist));
    // The console's browser code is bundled, not compiled file by file: one app.js and its page.
    for (const f of ['app.js', 'app.css', 'index.html', 'favicon.svg']) expect(out.has(`console/public/${f}`), f).toBe(true);
    for (const f of src) {
      if (f.startsWith('console/web/')) expect(out.has(f.replace(/\.tsx?$/, '.js')), f).toBe(false);
      else if (f.endsWith('.ts')) expect(out.has(f.replace(/\.ts$/, '.js')), f).toBe(true);
      // The runner's parts are joined into one file, dist/sandbox/runner.py (checked below).
      else if (f.startsWith('sandbox/runner/') || f.startsWith('runtime/local/spawner/')) expect(out.has(f), f).toBe(false);
      else if (path.basename(f) !== 'Dockerfile') expect(out.has(f), f).toBe(true);
    }
    expect([...out].filter((f) => f.endsWith('.ts'))).toEqual([]);
  });

  it.each([
    ['sandbox/runner', 'sandbox/runner.py'],
    ['runtime/local/spawner', 'runtime/local/spawner.py'],
  ])('writes dist/%s.py as its parts joined in name order', (partsDir, built) => {
    const parts = path.join(dir, 'src', partsDir);
    const joined = readdirSync(parts).filter((f) => f.endsWith('.py')).sort().map((f) => readFileSync(path.join(parts, f), 'utf8')).join('');
    expect(joined.length).toBeGreaterThan(1000);
    expect(readFileSync(path.join(dist, built), 'utf8')).toBe(joined);
  });

  it('rewrites every relative import to .js (node would refuse .ts without a loader)', () => {
    for (const f of filesUnder(dist).filter((x) => x.endsWith('.js'))) {
      const text = readFileSync(path.join(dist, f), 'utf8');
      expect(text.match(/(?:from|import\()\s*['"]\.{1,2}\/[^'"]*\.ts['"]/g), f).toBeNull();
    }
  });

  it('puts every file the code locates with new URL(..., import.meta.url) where the compiled code looks', () => {
    const refs: string[] = [];
    for (const f of filesUnder(path.join(dir, 'src')).filter((x) => x.endsWith('.ts'))) {
      const text = readFileSync(path.join(dir, 'src', f), 'utf8');
      // The bundler reads the browser sources only when it runs from src/ (npm run build, make run).
      if (f === 'console/bundle.ts') continue;
      // Likewise the typed client's generator (npm run gen:client), a tool of the repository.
      if (f === 'client/generate.ts') continue;
      for (const m of text.matchAll(/new URL\(\s*'([^']+)'\s*,\s*import\.meta\.url\s*\)/g)) {
        // paths.ts reads the runner's parts only from the source tree; compiled, it reads ./runner.py.
        if ((f === 'sandbox/paths.ts' && m[1] === './runner/') || (f === 'runtime/local/spawner.ts' && m[1] === './spawner/')) continue;
        const target = path.resolve(path.dirname(path.join(dist, f)), m[1]!);
        refs.push(path.relative(dir, target));
        expect(existsSync(target), `${f} reads ${m[1]} → ${target}`).toBe(true);
      }
    }
    // runner.py (both runtimes), spawner.py and ../package.json (the version) at least.
    expect(refs).toEqual(expect.arrayContaining(['dist/sandbox/runner.py', 'dist/runtime/local/spawner.py', 'package.json']));
  });
});

describe('the compiled service (node dist/main.js, no tsx)', () => {
  let child: ChildProcess | undefined;
  let logs = '';
  let url = '';
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    if (build.status !== 0) return;
    const workspace = path.join(dir, 'workspace');
    mkdirSync(workspace, { mode: 0o755 });
    const config = path.join(dir, 'config.json');
    writeFileSync(config, JSON.stringify({ host: '127.0.0.1', sandbox_engine: process.env.SANDPOD_TEST_ENGINE ?? 'bubblewrap', log_level: 'info' }));
    const port = await freePort();
    url = `http://127.0.0.1:${port}`;
    // No SVC_DATABASE_URL: the embedded PGlite under the workspace.
    env = { PATH: process.env.PATH, HOME: process.env.HOME, SVC_CONFIG: config, SVC_WORKSPACE: workspace, PORT: String(port), NODE_ENV: 'production' };
  });

  afterAll(async () => {
    if (child && child.exitCode === null) {
      child.kill('SIGKILL');
      await new Promise((r) => child!.once('exit', r));
    }
  });

  it('node dist/store/migrate.js (the chart’s hook) applies the migrations', () => {
    expect(build.status).toBe(0);
    const r = spawnSync(process.execPath, ['dist/store/migrate.js'], { cwd: dir, env, encoding: 'utf8', timeout: 120_000 });
    expect({ status: r.status, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    expect(JSON.parse(r.stdout.trim())).toEqual({ msg: 'migrations applied', database: 'pglite' });
  }, 150_000);

  it('starts, answers /health with the package version, runs code and drains on SIGTERM', async () => {
    expect(build.status).toBe(0);
    child = spawn(process.execPath, ['dist/main.js'], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout!.on('data', (d: Buffer) => (logs += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (logs += d.toString()));
    const deadline = Date.now() + 60_000;
    for (;;) {
      expect(child.exitCode, `exited early:\n${logs}`).toBeNull();
      const ok = await fetch(`${url}/readyz`).then((r) => r.ok, () => false);
      if (ok) break;
      expect(Date.now() < deadline, `not ready in 60 s:\n${logs}`).toBe(true);
      await new Promise((r) => setTimeout(r, 100));
    }
    const health = await fetch(`${url}/health`);
    const h = (await health.json()) as Record<string, any>;
    expect(health.status, JSON.stringify(h)).toBe(200);
    expect(h).toMatchObject({ version: PKG.version, database: expect.anything(), sandbox: { isolated: true } });

    const res = await fetch(`${url}/execute`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ code: 'import sys; print(6 * 7); print(sys.version_info[0])' }) });
    const body = (await res.json()) as Record<string, any>;
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(body).toMatchObject({ success: true, stdout: '42\n3\n', exit_code: 0, error: null });

    const exited = new Promise<number | null>((r) => child!.once('exit', (code) => r(code)));
    child.kill('SIGTERM');
    expect(await exited, logs).toBe(0);
  }, 120_000);
});
