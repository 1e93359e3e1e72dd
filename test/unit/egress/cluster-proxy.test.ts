/**
 * The shared (cluster) egress proxy over TCP: per-run credentials decide which patterns apply; no
 * valid credential is 407; refusals are logged with the execution id. The socket mode of the same
 * proxy is tested in test/unit/runtime/local/egress-proxy.test.ts.
 */
import { execFile } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import { Writable } from 'node:stream';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startClusterEgressProxy } from '../../../src/egress/cluster.ts';
import type { EgressProxy } from '../../../src/egress/proxy.ts';
import { egressProxyUrl, signEgressToken, type EgressGrant } from '../../../src/egress/token.ts';
import { createLogger } from '../../../src/logger.ts';

const KEY = 'a-shared-key-of-at-least-32-bytes!!';
const RUN_A = '11111111-1111-4111-8111-111111111111';
const RUN_B = '22222222-2222-4222-8222-222222222222';
let now = Date.UTC(2026, 10, 24, 1, 0, 0);
const clock = { now: () => now };

let upstream: http.Server;
let upstreamPort: number;
let otherUpstream: http.Server;
let otherPort: number;
let proxy: EgressProxy;
let logLines: Record<string, unknown>[] = [];

function serve(tag: string): Promise<{ server: http.Server; port: number }> {
  const server = http.createServer((req, res) => res.end(`${tag} ${req.method} ${req.url} auth=${req.headers['proxy-authorization'] ?? 'none'}`));
  return new Promise((r) => server.listen(0, '127.0.0.1', () => r({ server, port: (server.address() as net.AddressInfo).port })));
}

beforeAll(async () => {
  ({ server: upstream, port: upstreamPort } = await serve('upstream'));
  ({ server: otherUpstream, port: otherPort } = await serve('other'));
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString('utf8').split('\n').filter(Boolean)) logLines.push(JSON.parse(line) as Record<string, unknown>);
      cb();
    },
  });
  proxy = await startClusterEgressProxy({ key: KEY, port: 0, host: '127.0.0.1', logger: createLogger('info', 'json', sink), clock });
});

afterAll(async () => {
  await proxy.close();
  upstream.close();
  otherUpstream.close();
});

afterEach(() => {
  logLines = [];
});

const grantFor = (executionId: string, allowedHosts: string[], ttlMs = 60_000): EgressGrant => ({ executionId, allowedHosts, expiresAtMs: now + ttlMs });
const basic = (user: string, token: string) => `Basic ${Buffer.from(`${user}:${token}`).toString('base64')}`;

/** Sends one raw request to the proxy and returns everything it answers until it closes. */
function raw(request: string): Promise<{ status: number; head: string; body: string }> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s = net.connect(proxy.port, '127.0.0.1', () => s.write(request));
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('error', reject);
    s.on('close', () => {
      const text = Buffer.concat(chunks).toString('latin1');
      const split = text.indexOf('\r\n\r\n');
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]), head: text.slice(0, split), body: text.slice(split + 4) });
    });
  });
}

function get(port: number, auth?: string): Promise<{ status: number; head: string; body: string }> {
  return raw(`GET http://127.0.0.1:${port}/x HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n${auth ? `Proxy-Authorization: ${auth}\r\n` : ''}\r\n`);
}

describe('cluster egress proxy (TCP, per-run credentials)', () => {
  it('a valid credential: the run\'s patterns apply, and the credential is not forwarded', async () => {
    const token = signEgressToken(grantFor(RUN_A, [`127.0.0.1:${upstreamPort}`]), KEY);
    const r = await get(upstreamPort, basic(RUN_A, token));
    expect(r.status).toBe(200);
    expect(r.body).toBe('upstream GET /x auth=none');
    expect(logLines).toContainEqual(expect.objectContaining({ level: 'info', msg: 'egress allowed', execution_id: RUN_A, host: '127.0.0.1', port: upstreamPort }));
  });

  it('CONNECT with a valid credential opens the tunnel', async () => {
    const token = signEgressToken(grantFor(RUN_A, [`127.0.0.1:${upstreamPort}`]), KEY);
    const r = await raw(
      `CONNECT 127.0.0.1:${upstreamPort} HTTP/1.1\r\nProxy-Authorization: ${basic(RUN_A, token)}\r\n\r\nGET /tunnelled HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`,
    );
    expect(r.status).toBe(200);
    expect(r.body).toContain('upstream GET /tunnelled');
  });

  it.each([
    ['missing', () => undefined, 'missing'],
    ['forged (another key)', () => basic(RUN_A, signEgressToken(grantFor(RUN_A, ['*', '127.0.0.1']), 'x'.repeat(32))), 'bad signature'],
    ['expired', () => basic(RUN_A, signEgressToken(grantFor(RUN_A, ['127.0.0.1'], -1000), KEY)), 'expired'],
    ['another run\'s token under this run\'s name', () => basic(RUN_A, signEgressToken(grantFor(RUN_B, ['127.0.0.1']), KEY)), 'user does not match'],
    ['garbage', () => 'Basic !!!', 'malformed'],
  ])('%s credential → 407 with a Basic challenge, nothing reaches upstream', async (_name, auth, why) => {
    const r = await get(upstreamPort, auth());
    expect(r.status).toBe(407);
    expect(r.head).toContain('Proxy-Authenticate: Basic realm="sandpod-egress"');
    expect(r.body).toContain(`proxy authentication failed (${why})`);
    expect(r.body).not.toContain('upstream');
    expect(logLines).toContainEqual(expect.objectContaining({ level: 'warn', msg: 'egress refused', host: '127.0.0.1', allowed: false }));
  });

  it('each run gets its own patterns: run B cannot use run A\'s hosts, and the refusal names run B', async () => {
    const a = basic(RUN_A, signEgressToken(grantFor(RUN_A, [`127.0.0.1:${upstreamPort}`]), KEY));
    const b = basic(RUN_B, signEgressToken(grantFor(RUN_B, [`127.0.0.1:${otherPort}`]), KEY));
    const [aOwn, bOnA, bOwn, aOnB] = await Promise.all([get(upstreamPort, a), get(upstreamPort, b), get(otherPort, b), get(otherPort, a)]);
    expect([aOwn.status, bOnA.status, bOwn.status, aOnB.status]).toEqual([200, 403, 200, 403]);
    expect(bOwn.body).toContain('other GET /x');
    expect(bOnA.body).toContain(`egress to 127.0.0.1:${upstreamPort} is not allowed`);
    expect(logLines).toContainEqual(expect.objectContaining({ level: 'warn', msg: 'egress refused', execution_id: RUN_B, port: upstreamPort }));
    expect(logLines).toContainEqual(expect.objectContaining({ level: 'warn', msg: 'egress refused', execution_id: RUN_A, port: otherPort }));
  });

  it('a token stops working once it expires (the proxy\'s clock)', async () => {
    const auth = basic(RUN_A, signEgressToken(grantFor(RUN_A, [`127.0.0.1:${upstreamPort}`], 5000), KEY));
    expect((await get(upstreamPort, auth)).status).toBe(200);
    now += 5000;
    expect((await get(upstreamPort, auth)).status).toBe(407);
  });

  it('Python urllib with the proxy URL a run pod gets: allowed host 200, other host 403', async () => {
    const url = egressProxyUrl(`http://127.0.0.1:${proxy.port}`, grantFor(RUN_A, [`127.0.0.1:${upstreamPort}`]), KEY);
    const script = [
      'import sys, urllib.request, urllib.error',
      'for u in sys.argv[1:]:',
      '    try:',
      '        print(urllib.request.urlopen(u, timeout=10).status)',
      '    except urllib.error.HTTPError as e:',
      '        print(e.code)',
    ].join('\n');
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HTTP_PROXY: url, http_proxy: url, NO_PROXY: '', no_proxy: '' };
    const { stdout } = await promisify(execFile)('python3', ['-c', script, `http://127.0.0.1:${upstreamPort}/`, `http://127.0.0.1:${otherPort}/`], { env });
    expect(stdout.trim().split('\n')).toEqual(['200', '403']);
    expect(logLines).toContainEqual(expect.objectContaining({ msg: 'egress refused', execution_id: RUN_A, port: otherPort }));
  });
});
