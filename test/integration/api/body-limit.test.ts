/**
 * A body over max_body_bytes is answered 413, and the client reads that answer (issue 23 item 4):
 * clients that write the whole request before reading (Python's http.client, requests, urllib) must
 * not get a broken pipe, even when their body arrives late. Raw sockets, so the test writes exactly
 * as such a client does: every byte first, then read. The same for a session file's PUT over
 * max_artifact_bytes (issue 19), whose body is raw bytes, not JSON.
 */
import { connect, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listen, startTestService, useServedService, type TestService } from '../../support/service.ts';

const LIMIT = 1024 * 1024;
const BODY = Buffer.alloc(2_000_000, 'a');

function write(sock: Socket, data: Buffer | string): Promise<void> {
  return new Promise((resolve, reject) => sock.write(data, (err) => (err ? reject(err) : resolve())));
}

/** Writes the request (the body `lateMs` after the head), then reads until the server closes or the answer is complete. */
async function postWholeThenRead(port: number, path: string, body: Buffer, opts: { lateMs?: number; type?: string } = {}): Promise<string> {
  const sock = connect(port, '127.0.0.1');
  await new Promise<void>((resolve, reject) => sock.once('connect', resolve).once('error', reject));
  let received = '';
  const done = new Promise<string>((resolve) => {
    sock.on('data', (c: Buffer) => {
      received += c.toString('latin1');
      const head = received.indexOf('\r\n\r\n');
      const len = /content-length: (\d+)/i.exec(received);
      if (head >= 0 && len && received.length >= head + 4 + Number(len[1])) resolve(received);
    });
    sock.on('close', () => resolve(received));
  });
  sock.on('error', () => {});
  const head = `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: ${opts.type ?? 'application/json'}\r\nContent-Length: ${body.length}\r\n\r\n`;
  try {
    await write(sock, head);
    if (opts.lateMs) await new Promise((r) => setTimeout(r, opts.lateMs));
    await write(sock, body);
  } catch (err) {
    sock.destroy();
    return `write failed: ${(err as Error).message}`;
  }
  const answer = await done;
  sock.destroy();
  return answer;
}

describe('413 for a body over max_body_bytes', () => {
  let svc: TestService;
  let server: ServerType;
  let port: number;
  beforeAll(async () => {
    svc = await startTestService({ sandbox_engine: 'process', max_body_bytes: LIMIT });
    server = await listen(svc, 0, '127.0.0.1');
    port = (server.address() as AddressInfo).port;
  }, 120_000);
  afterAll(async () => {
    await new Promise<void>((r) => server?.close(() => r()));
    await svc?.close();
  });

  it('30 back-to-back clients that write 2 MB before reading all read the 413', async () => {
    const answers: string[] = [];
    for (let i = 0; i < 30; i++) answers.push(await postWholeThenRead(port, '/execute', BODY));
    for (const a of answers) {
      expect(a.slice(0, 12)).toBe('HTTP/1.1 413');
      expect(a).toContain(`request body exceeds ${LIMIT} bytes`);
    }
  }, 120_000);

  it('a body sent a second (and three seconds) after the head still gets the 413', async () => {
    for (const lateMs of [1000, 3000]) {
      const a = await postWholeThenRead(port, '/execute/async', BODY, { lateMs });
      expect(a.slice(0, 12)).toBe('HTTP/1.1 413');
    }
  }, 60_000);

  it('a chunked body (no Content-Length) that passes the limit while being read gets the 413 too', async () => {
    const sock = connect(port, '127.0.0.1');
    await new Promise<void>((resolve) => sock.once('connect', resolve));
    let received = '';
    sock.on('data', (c: Buffer) => (received += c.toString('latin1')));
    sock.on('error', () => {});
    await write(sock, `POST /execute HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`);
    const piece = Buffer.alloc(64 * 1024, 'a');
    for (let i = 0; i < 32; i++) await write(sock, Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]));
    await write(sock, '0\r\n\r\n');
    await expect.poll(() => received, { timeout: 10_000 }).toContain('exceeds');
    expect(received.slice(0, 12)).toBe('HTTP/1.1 413');
    sock.destroy();
  }, 30_000);

  it('the 415 of a large non-JSON body is read the same way', async () => {
    const a = await postWholeThenRead(port, '/execute', Buffer.alloc(600_000, 'x'), { lateMs: 1000, type: 'text/plain' });
    expect(a.slice(0, 12)).toBe('HTTP/1.1 415');
  }, 30_000);

  it('the connection stays usable after the discarded body (keep-alive)', async () => {
    const sock = connect(port, '127.0.0.1');
    await new Promise<void>((resolve) => sock.once('connect', resolve));
    let received = '';
    sock.on('data', (c: Buffer) => (received += c.toString('latin1')));
    await write(sock, `POST /execute HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nContent-Length: ${BODY.length}\r\n\r\n`);
    await write(sock, BODY);
    await write(sock, `GET /livez HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`);
    await expect.poll(() => received, { timeout: 10_000 }).toContain('{"status":"ok"}');
    expect(received.slice(0, 12)).toBe('HTTP/1.1 413');
    sock.destroy();
  }, 30_000);
});

describe.skipIf(process.getuid?.() !== 0)('413 for a session file over max_artifact_bytes', () => {
  const served = useServedService({ max_artifact_bytes: LIMIT, warm_pool: { sizes: {} } });

  /** Writes each request whole on one connection, then reads: the answers, in order. */
  async function onOneConnection(requests: (string | Buffer)[], expectAnswers: number): Promise<string> {
    const port = Number(new URL(served.url).port);
    const sock = connect(port, '127.0.0.1');
    await new Promise<void>((resolve) => sock.once('connect', resolve));
    let received = '';
    sock.on('data', (c: Buffer) => (received += c.toString('latin1')));
    sock.on('error', () => {});
    for (const r of requests) await write(sock, r);
    await expect.poll(() => received.split('HTTP/1.1 ').length - 1, { timeout: 15_000 }).toBe(expectAnswers);
    sock.destroy();
    return received;
  }

  it('the client reads the 413 and the connection stays usable (Content-Length, and chunked)', async () => {
    const created = await fetch(`${served.url}/sessions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    const id = ((await created.json()) as { session_id: string }).session_id;
    const host = `Host: 127.0.0.1:${new URL(served.url).port}`;
    const head = (extra: string) => `PUT /sessions/${id}/files/big.bin HTTP/1.1\r\n${host}\r\nContent-Type: application/octet-stream\r\n${extra}\r\n`;
    const big = Buffer.alloc(LIMIT + 1, 'b');
    const a = await onOneConnection([head(`Content-Length: ${big.length}\r\n`), big, `GET /sessions/${id}/files HTTP/1.1\r\n${host}\r\n\r\n`], 2);
    expect(a.slice(0, 12)).toBe('HTTP/1.1 413');
    expect(a).toContain('over max_artifact_bytes');
    expect(a).toContain('{"items":[],"count":0}');
    const piece = Buffer.alloc(64 * 1024, 'c');
    const chunks = Array.from({ length: 17 }, () => Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]));
    const b = await onOneConnection([head('Transfer-Encoding: chunked\r\n'), ...chunks, '0\r\n\r\n', `GET /livez HTTP/1.1\r\n${host}\r\n\r\n`], 2);
    expect(b.slice(0, 12)).toBe('HTTP/1.1 413');
    expect(b).toContain('{"status":"ok"}');
    // A file within the cap is written as before.
    const ok = await fetch(`${served.url}/sessions/${id}/files/small.bin`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: Buffer.alloc(LIMIT, 's') });
    expect(ok.status).toBe(201);
    await fetch(`${served.url}/sessions/${id}`, { method: 'DELETE' });
  }, 60_000);
});
