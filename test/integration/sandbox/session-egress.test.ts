/**
 * A session of a job type with `allowed_hosts` keeps that type's network rules (issue 19: every way to
 * a sandbox, session cells included, gets the same network rules): its cells reach exactly the listed
 * hosts through a proxy of the session's own, and nothing else, not even by connecting directly.
 */
import { mkdtempSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import type { SessionSandbox } from '../../../src/runtime/session.ts';
import { describeEachEngine } from '../../support/engines.ts';

const asRoot = process.getuid?.() === 0;

async function site(name: string): Promise<{ port: number; close: () => Promise<void> }> {
  const server = http.createServer((_req, res) => res.end(name));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as AddressInfo).port, close: () => new Promise((r) => server.close(() => r())) };
}

const PROBE = `
import socket, urllib.request, urllib.error
for url in URLS:
    try:
        r = urllib.request.urlopen(url, timeout=10)
        print(url, r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(url, e.code)
    except Exception as e:
        print(url, 'error', type(e).__name__)
s = socket.socket()
s.settimeout(3)
try:
    s.connect(('127.0.0.1', DIRECT))
    print('direct connected')
except OSError as e:
    print('direct refused', type(e).__name__)
`;

describeEachEngine('session network rules', (engine) => {
  let rt: LocalRuntime;
  let config: Config;
  let a: Awaited<ReturnType<typeof site>>;
  let b: Awaited<ReturnType<typeof site>>;
  const open: SessionSandbox[] = [];
  beforeAll(async () => {
    a = await site('site-a');
    b = await site('site-b');
    const workspace = mkdtempSync(path.join('/tmp', 'sandpod-sess-net-'));
    config = parseConfig(
      { workspace, sandbox_engine: engine, warm_pool: { sizes: {} }, job_types: [{ name: 'to-a', network: { mode: 'bridge', allowed_hosts: [`127.0.0.1:${a.port}`] } }] },
      {},
    );
    rt = createLocalRuntime(config);
    await rt.start();
  }, 120_000);
  afterAll(async () => {
    for (const s of open) await s.destroy().catch(() => {});
    await rt?.stop();
    await a?.close();
    await b?.close();
  });

  it.skipIf(!asRoot)('an allowed_hosts type: the cells reach the listed host through the proxy, get 403 for another, and cannot connect around it', async () => {
    const jt = new FileJobTypeRegistry(config).get('to-a')!;
    const s = await rt.openSession!(jt, { maxStreamBytes: 32768, startupMs: 60_000 });
    open.push(s);
    const code = `URLS = ['http://127.0.0.1:${a.port}/', 'http://127.0.0.1:${b.port}/']\nDIRECT = ${b.port}\n${PROBE}`;
    const r = await s.runCell({ cell: 1, code, inputJson: '{}', timeoutSec: 30, maxStdoutBytes: 32768, maxArtifactBytes: 1 << 20 });
    expect(r.stderr).toBe('');
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe(`http://127.0.0.1:${a.port}/ 200 site-a`);
    expect(lines[1]).toBe(`http://127.0.0.1:${b.port}/ 403`);
    expect(lines[2]).toMatch(/^direct refused /);
    // The state persists with the proxy: a second cell still goes through it.
    const again = await s.runCell({ cell: 2, code: `import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:${a.port}/', timeout=10).read().decode())`, inputJson: '{}', timeoutSec: 30, maxStdoutBytes: 32768, maxArtifactBytes: 1 << 20 });
    expect(again.stdout).toBe('site-a\n');
  }, 120_000);
});
