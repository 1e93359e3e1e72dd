/**
 * The cluster egress proxy as its container runs it (`src/egress/main.ts`, compiled to
 * dist/egress/main.js): configuration from the environment, a JSON log line per decision with the
 * execution id, a clear refusal to start without a usable key, and a clean exit on SIGTERM.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { egressProxyUrl } from '../../../src/egress/token.ts';
import { freePort } from '../../support/process.ts';

const ROOT = path.resolve(import.meta.dirname, '../../..');
const MAIN = path.join(ROOT, 'src/egress/main.ts');
const KEY = 'process-test-key-0123456789abcdefghijkl';
const RUN = '7d1c0f4e-2b3a-4c5d-8e9f-0a1b2c3d4e5f';

let dir: string;
let site: http.Server;
let sitePort: number;
beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'egress-main-'));
  site = http.createServer((_req, res) => res.end('site'));
  await new Promise<void>((r) => site.listen(0, '127.0.0.1', () => r()));
  sitePort = (site.address() as net.AddressInfo).port;
});
afterAll(() => site.close());

function start(env: Record<string, string>): { child: ChildProcess; out: () => string } {
  let out = '';
  const child = spawn(process.execPath, ['--import', 'tsx', MAIN], { cwd: ROOT, env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  return { child, out: () => out };
}

async function until(cond: () => boolean, what: string, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function get(proxyPort: number, target: string, auth?: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: proxyPort, method: 'GET', path: target, headers: auth ? { 'proxy-authorization': auth } : {} }, (res) => {
      res.resume();
      resolve(res.statusCode!);
    });
    req.on('error', reject);
    req.end();
  });
}

describe('egress proxy process (src/egress/main.ts)', () => {
  it('serves on SANDPOD_EGRESS_PORT with the key file, logs decisions with the execution id, exits 0 on SIGTERM', async () => {
    const keyFile = path.join(dir, 'key');
    writeFileSync(keyFile, `${KEY}\n`);
    const port = await freePort();
    const healthPort = await freePort();
    const p = start({ SANDPOD_EGRESS_KEY_FILE: keyFile, SANDPOD_EGRESS_PORT: String(port), SANDPOD_EGRESS_HEALTH_PORT: String(healthPort), SANDPOD_EGRESS_HOST: '127.0.0.1', SVC_LOG_FORMAT: 'json' });
    const exited = new Promise<number | null>((r) => p.child.once('exit', (code) => r(code)));
    try {
      await until(() => p.out().includes('egress proxy listening'), 'listening');
      expect(await fetch(`http://127.0.0.1:${healthPort}/livez`).then((r) => r.status)).toBe(200);
      const ready = await fetch(`http://127.0.0.1:${healthPort}/readyz`);
      expect([ready.status, await ready.json()]).toEqual([200, { status: 'ready', admitted: 0, pending: 0, max_connections: 1024, max_pending: 1024 }]);
      const url = new URL(egressProxyUrl(`http://127.0.0.1:${port}`, { executionId: RUN, allowedHosts: [`127.0.0.1:${sitePort}`], expiresAtMs: Date.now() + 60_000 }, KEY));
      const auth = `Basic ${Buffer.from(`${decodeURIComponent(url.username)}:${url.password}`).toString('base64')}`;
      expect(await get(port, `http://127.0.0.1:${sitePort}/`, auth)).toBe(200);
      expect(await get(port, 'http://127.0.0.2:81/', auth)).toBe(403);
      expect(await get(port, `http://127.0.0.1:${sitePort}/`)).toBe(407);
      await until(() => p.out().split('\n').filter((l) => l.includes('"egress refused"')).length >= 2, 'refusal logs');
      const lines = p.out().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(lines).toContainEqual(expect.objectContaining({ level: 'info', msg: 'egress allowed', execution_id: RUN, component: 'egress-proxy' }));
      expect(lines).toContainEqual(expect.objectContaining({ level: 'warn', msg: 'egress refused', execution_id: RUN, host: '127.0.0.2', port: 81 }));
      p.child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      p.child.kill('SIGKILL');
    }
  }, 60_000);

  it.each([
    ['no key file setting', {}, /SANDPOD_EGRESS_KEY_FILE is not set/],
    ['a key that is too short', { key: 'short' }, /needs at least 32 bytes/],
    ['a bad port', { key: KEY, SANDPOD_EGRESS_PORT: 'abc' }, /SANDPOD_EGRESS_PORT: must be a non-negative integer/],
  ])('refuses to start with %s (exit 1, a one-line reason)', (_name, o: Record<string, string>, why) => {
    const env: Record<string, string> = { PATH: process.env.PATH ?? '' };
    if (o.key !== undefined) {
      const f = path.join(dir, `key-${Math.random()}`);
      writeFileSync(f, o.key);
      env.SANDPOD_EGRESS_KEY_FILE = f;
    }
    if (o.SANDPOD_EGRESS_PORT) env.SANDPOD_EGRESS_PORT = o.SANDPOD_EGRESS_PORT;
    const r = spawnSync(process.execPath, ['--import', 'tsx', MAIN], { cwd: ROOT, env, encoding: 'utf8', timeout: 30_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(why);
  }, 60_000);
});
