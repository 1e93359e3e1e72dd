/**
 * Fault: the database is unreachable when the service starts (issue #9 §6). The real entry point
 * (`node --import tsx src/main.ts`) must exit non-zero with one clear line naming the database URL
 * (without its password) and what failed — not a stack trace, not a process that hangs or listens.
 */
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../support/process.ts';

const ROOT = path.resolve(import.meta.dirname, '../../..');
const workspace = mkdtempSync(path.join(tmpdir(), 'sandpod-ws-'));
chmodSync(workspace, 0o755);
afterAll(() => rmSync(workspace, { recursive: true, force: true }));

function startMain(databaseUrl: string): Promise<{ code: number | null; stderr: string; stdout: string; ms: number }> {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts'], {
      cwd: ROOT,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, SVC_DATABASE_URL: databaseUrl, SVC_WORKSPACE: workspace, PORT: '0', SVC_LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the service did not exit within 60 s:\n${stdout}${stderr}`));
    }, 60_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stderr, stdout, ms: Date.now() - t0 });
    });
  });
}

describe('database unreachable at start', () => {
  it('exits non-zero with one line naming the URL (no password) and the failure', async () => {
    const port = await freePort(); // nothing listens there
    const r = await startMain(`postgres://sandpod:s3cret-pw@127.0.0.1:${port}/sandpod`);
    expect(r.code).not.toBe(0);
    expect(r.code).not.toBeNull();
    expect(r.stderr).toContain(`sandpod: failed to start: cannot connect to the database at postgres://sandpod:***@127.0.0.1:${port}/sandpod: `);
    expect(r.stderr).toMatch(/ECONNREFUSED/);
    expect(r.stderr + r.stdout).not.toContain('s3cret-pw');
    // One line, not a stack trace.
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stdout).not.toContain('sandpod listening');
  }, 90_000);
});
