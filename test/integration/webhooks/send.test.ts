/**
 * One attempt over real sockets (src/webhooks/send.ts): HTTPS to a name dialled at the address that
 * was checked (the certificate and SNI still name the host), the answer capped, a dead port an error.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer as createHttp } from 'node:http';
import { createServer as createHttps } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { send } from '../../../src/webhooks/send.ts';
import { resolveTarget, type ResolvedTarget } from '../../../src/webhooks/ssrf.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'hooks-tls-'));
const key = path.join(dir, 'key.pem');
const cert = path.join(dir, 'cert.pem');
execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=hooks.test', '-addext', 'subjectAltName=DNS:hooks.test'], { stdio: 'ignore' });

const seen: { sni: string | undefined; host: string | undefined; body: string }[] = [];
const tls = createHttps({ key: readFileSync(key), cert: readFileSync(cert) }, (req, res) => {
  let body = '';
  req.on('data', (c: Buffer) => (body += c.toString()));
  req.on('end', () => {
    seen.push({ sni: (req.socket as TLSSocket & { servername?: string }).servername || undefined, host: req.headers.host, body });
    res.writeHead(204).end();
  });
});
let bigSent = 0;
const big = createHttp((req, res) => {
  req.resume();
  res.writeHead(200);
  const chunk = Buffer.alloc(64 * 1024, 120);
  const pump = () => {
    while (bigSent < 64 * 1024 * 1024 && res.write(chunk)) bigSent += chunk.length;
    if (bigSent < 64 * 1024 * 1024) res.once('drain', pump);
    else res.end();
  };
  pump();
});
const port = (s: { address(): unknown }) => (s.address() as AddressInfo).port;
const lookup = async () => [{ address: '127.0.0.1', family: 4 }];
const rules = { allowed_hosts: ['hooks.test'], allow_private_addresses: true };

beforeAll(async () => {
  await new Promise<void>((r) => tls.listen(0, '127.0.0.1', r));
  await new Promise<void>((r) => big.listen(0, '127.0.0.1', r));
});
afterAll(async () => {
  big.closeAllConnections();
  await new Promise((r) => tls.close(r));
  await new Promise((r) => big.close(r));
});

describe('send', () => {
  it('HTTPS to a name dialled at the checked address: SNI and Host name the host, the certificate is verified', async () => {
    const t = (await resolveTarget(`https://hooks.test:${port(tls)}/h`, rules, lookup)) as ResolvedTarget;
    expect(t.address).toBe('127.0.0.1');
    const o = { headers: { 'webhook-id': 'msg_1' }, body: '{"a":1}', timeoutMs: 10_000, maxResponseBytes: 4096 };
    expect(await send(t, { ...o, tls: { ca: readFileSync(cert) } })).toEqual({ kind: 'answered', statusCode: 204 });
    expect(seen).toEqual([{ sni: 'hooks.test', host: `hooks.test:${port(tls)}`, body: '{"a":1}' }]);
    // Not trusted: an error, not an answer.
    const r = await send(t, o);
    expect(r).toMatchObject({ kind: 'error', message: expect.stringMatching(/SELF_SIGNED|self.signed/i) });
  });

  it('reads at most max_response_bytes of an answer, then hangs up', async () => {
    const t = (await resolveTarget(`http://127.0.0.1:${port(big)}/`, { allowed_hosts: ['127.0.0.1'], allow_private_addresses: false })) as ResolvedTarget;
    expect(await send(t, { headers: {}, body: '{}', timeoutMs: 10_000, maxResponseBytes: 4096 })).toEqual({ kind: 'answered', statusCode: 200 });
    // The server could not push its 64 MiB: the connection was closed long before.
    await new Promise((r) => setTimeout(r, 200));
    expect(bigSent).toBeLessThan(16 * 1024 * 1024);
  });

  it('a closed port is an error (retried by the decision), within the deadline', async () => {
    const t: ResolvedTarget = { url: new URL('http://127.0.0.1:9/'), address: '127.0.0.1', family: 4 };
    expect(await send(t, { headers: {}, body: '{}', timeoutMs: 10_000, maxResponseBytes: 4096 })).toMatchObject({ kind: 'error', message: expect.stringContaining('ECONNREFUSED') });
  });
});
