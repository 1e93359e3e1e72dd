/**
 * The `process` engine runs code with no isolation, so the real entry point refuses to expose it:
 * with a non-loopback `host` it exits non-zero with one line saying why and what to do, and never
 * listens (issue #12 point 6). On loopback it starts.
 */
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { freePort } from '../../support/process.ts';

const ROOT = path.resolve(import.meta.dirname, '../../..');
const dir = mkdtempSync(path.join(tmpdir(), 'sandpod-expose-'));
chmodSync(dir, 0o755);
let db: TestDatabase;
// PostgreSQL when the suite has it (PGlite's first start is slow on a busy machine).
beforeAll(async () => {
  db = await freshDatabase();
});
afterAll(async () => {
  await db?.drop();
  rmSync(dir, { recursive: true, force: true });
});
const configFile = path.join(dir, 'config.yaml');
writeFileSync(configFile, 'sandbox_engine: process\nsecurity_mode: permissive\n');

/** Starts `src/main.ts`; resolves when it exits, or when it says it listens (then it is stopped). */
function startMain(host: string, port: number): Promise<{ code: number | null; stderr: string; stdout: string; listened: boolean }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        SVC_CONFIG: configFile,
        SVC_WORKSPACE: path.join(dir, `ws-${port}`),
        SVC_HOST: host,
        PORT: String(port),
        SVC_LOG_FORMAT: 'json',
        ...(db.url ? { SVC_DATABASE_URL: db.url } : {}),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    let listened = false;
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
      if (!listened && stdout.includes('sandpod listening')) {
        listened = true;
        child.kill('SIGTERM');
      }
    });
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the service neither exited nor listened within 120 s:\n${stdout}${stderr}`));
    }, 120_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stderr, stdout, listened });
    });
  });
}

describe('the process engine and the listen address', () => {
  it('refuses 0.0.0.0: one line, non-zero exit, nothing listening', async () => {
    const port = await freePort();
    const r = await startMain('0.0.0.0', port);
    expect(r.listened).toBe(false);
    expect(r.code).not.toBe(0);
    expect(r.code).not.toBeNull();
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain('sandpod: failed to start: the process engine gives no isolation');
    expect(r.stderr).toContain('host is 0.0.0.0');
    const probe = await fetch(`http://127.0.0.1:${port}/livez`).then(() => 'answered', () => 'refused');
    expect(probe).toBe('refused');
  }, 150_000);

  it('starts on 127.0.0.1 and says where it listens', async () => {
    const port = await freePort();
    const r = await startMain('127.0.0.1', port);
    expect(r.listened).toBe(true);
    // Signalled the moment it said it listens: it shut down cleanly and unmounted its runs tmpfs.
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync('/proc/self/mounts', 'utf8')).not.toContain(dir);
    const line = r.stdout.split('\n').find((l) => l.includes('sandpod listening'))!;
    expect(JSON.parse(line)).toMatchObject({ host: '127.0.0.1', port, engine: 'process', isolated: false });
  }, 150_000);
});
