/**
 * DNS rebinding and cross-site requests against the local default (issue 22 item 7), over a real
 * socket with the Host, Origin and Sec-Fetch-Site headers a browser would send: with authentication
 * off, a rebound name cannot run code or read runs, another site's form or text POST cannot rerun,
 * cancel or build, and the console's own same-origin requests still work.
 */
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listen, startTestService, type TestService } from '../../support/service.ts';

interface Answer {
  status: number;
  body: Record<string, any>;
}

/** One request with exactly these headers (fetch would not let a test set Host). */
function send(port: number, method: string, path: string, headers: Record<string, string>, body?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, method, path, headers: { ...headers, ...(body !== undefined ? { 'content-length': String(Buffer.byteLength(body)) } : {}) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let parsed: Record<string, any> = {};
        try {
          parsed = JSON.parse(text) as Record<string, any>;
        } catch {
          parsed = { text };
        }
        resolve({ status: res.statusCode ?? 0, body: parsed });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

const REBOUND = { host: 'rebind.attacker.example' };
const JSON_TYPE = { 'content-type': 'application/json' };

describe('without authentication', () => {
  let svc: TestService;
  let server: ServerType;
  let port: number;
  let self: Record<string, string>;
  let finished: string;
  const count = async () => {
    const b = (await send(port, 'GET', '/executions?limit=100', self)).body;
    return ((b.items ?? b.executions) as unknown[]).length;
  };

  beforeAll(async () => {
    svc = await startTestService({ sandbox_engine: 'process', job_types: [{ name: 'default' }] });
    server = await listen(svc, 0, '127.0.0.1');
    port = (server.address() as AddressInfo).port;
    self = { host: `127.0.0.1:${port}` };
    const run = await send(port, 'POST', '/execute', { ...self, ...JSON_TYPE }, JSON.stringify({ code: 'print(1)' }));
    expect(run.status).toBe(200);
    finished = run.body.execution_id as string;
  }, 120_000);
  afterAll(async () => {
    await new Promise<void>((r) => server?.close(() => r()));
    await svc?.close();
  });

  it('a rebound Host cannot run code, list runs or read one; the answer says why', async () => {
    const before = await count();
    const run = await send(port, 'POST', '/execute', { ...REBOUND, ...JSON_TYPE }, JSON.stringify({ code: 'print(1)' }));
    expect(run.status).toBe(403);
    expect(run.body).toMatchObject({ code: 'forbidden', detail: expect.stringContaining("Host 'rebind.attacker.example' is not allowed") });
    expect(run.body.detail).toContain('http.allowed_hosts');
    expect((await send(port, 'POST', '/execute/async', { ...REBOUND, ...JSON_TYPE }, JSON.stringify({ code: 'print(1)' }))).status).toBe(403);
    expect((await send(port, 'GET', '/executions', REBOUND)).status).toBe(403);
    expect((await send(port, 'GET', `/executions/${finished}`, REBOUND)).status).toBe(403);
    expect((await send(port, 'GET', `/jobs/${finished}/events`, REBOUND)).status).toBe(403);
    expect((await send(port, 'GET', '/metrics', REBOUND)).status).toBe(403);
    expect((await send(port, 'GET', '/ui', { host: 'rebind.attacker.example:8000' })).status).toBe(403);
    expect(await count()).toBe(before);
  });

  it('the probes answer any Host; /health gives a rebound Host only its status', async () => {
    expect((await send(port, 'GET', '/livez', REBOUND)).status).toBe(200);
    expect((await send(port, 'GET', '/readyz', { host: '10.1.2.3:8000' })).status).toBe(200);
    const brief = await send(port, 'GET', '/health', REBOUND);
    expect(brief.status).toBe(200);
    expect(brief.body).toEqual({ status: 'healthy' });
    const full = await send(port, 'GET', '/health', { host: `localhost:${port}` });
    expect(full.body).toMatchObject({ status: 'healthy', sandbox: { engine: 'process' }, database: { available: true } });
  });

  it('rerun, cancel and build refuse cross-site form and text POSTs, with or without the browser headers', async () => {
    const slow = await send(port, 'POST', '/execute/async', { ...self, ...JSON_TYPE }, JSON.stringify({ code: 'import time; time.sleep(30)' }));
    expect(slow.status).toBe(202);
    const before = await count();
    const targets = [`/jobs/${finished}/rerun`, `/jobs/${slow.body.job_id}/cancel`, '/job-types/default/build'];
    const attacks: [string, Record<string, string>, string, number][] = [
      ['a form from another site', { 'content-type': 'application/x-www-form-urlencoded', origin: 'http://evil.example', 'sec-fetch-site': 'cross-site' }, 'a=1', 403],
      ['text from another site', { 'content-type': 'text/plain', origin: 'http://evil.example', 'sec-fetch-site': 'cross-site' }, '{"x":1}', 403],
      ['an empty form from another site', { 'content-type': 'application/x-www-form-urlencoded', origin: 'http://evil.example' }, '', 403],
      ['JSON-looking text from a page on another port (same-site)', { 'content-type': 'text/plain', origin: `http://localhost:3000`, 'sec-fetch-site': 'same-site' }, '{}', 403],
      ['an opaque origin', { origin: 'null' }, '', 403],
      ['a form with no browser headers', { 'content-type': 'application/x-www-form-urlencoded' }, 'a=1', 415],
      ['text with no browser headers', { 'content-type': 'text/plain' }, '{"wait":false}', 415],
    ];
    for (const target of targets) {
      for (const [what, headers, body, status] of attacks) {
        const res = await send(port, 'POST', target, { ...self, ...headers }, body);
        expect({ target, what, status: res.status }).toEqual({ target, what, status });
        if (status === 403) expect(res.body.detail).toContain('cross-site request refused');
        if (status === 415) expect(res.body.detail).toContain('Content-Type must be application/json');
      }
    }
    expect(await count()).toBe(before);
    expect((await send(port, 'GET', `/jobs/${slow.body.job_id}`, self)).body.status).toMatch(/pending|running/);
    expect((await send(port, 'GET', '/job-types/default/builds', self)).body).not.toMatchObject({ items: [expect.anything()] });
    // The same requests from the service's own page (the console) and from plain clients work.
    const sameOrigin = { ...self, origin: `http://127.0.0.1:${port}`, 'sec-fetch-site': 'same-origin' };
    expect((await send(port, 'POST', `/jobs/${finished}/rerun`, sameOrigin)).status).toBe(202);
    expect((await send(port, 'POST', `/jobs/${slow.body.job_id}/cancel`, { ...sameOrigin, ...JSON_TYPE })).status).toBeLessThan(300);
    expect((await send(port, 'POST', `/execute`, { ...sameOrigin, ...JSON_TYPE }, JSON.stringify({ code: 'print(7)' }))).body.stdout).toBe('7\n');
    expect((await send(port, 'POST', `/execute`, { host: `localhost:${port}`, ...JSON_TYPE }, JSON.stringify({ code: 'print(8)' }))).body.stdout).toBe('8\n');
  }, 60_000);

  it('a route that takes no body refuses one (400); a body without Content-Type is 415', async () => {
    const cancel = await send(port, 'POST', `/jobs/${finished}/cancel`, { ...self, ...JSON_TYPE }, '{}');
    expect(cancel.status).toBe(400);
    expect(cancel.body.detail).toContain('takes no request body');
    expect((await send(port, 'DELETE', '/dlq/1', { ...self, ...JSON_TYPE }, '{}')).status).toBe(400);
    expect((await send(port, 'POST', '/execute', self, JSON.stringify({ code: 'print(1)' }))).status).toBe(415);
  });
});

describe('http.allowed_hosts', () => {
  let svc: TestService;
  let server: ServerType;
  let port: number;
  beforeAll(async () => {
    svc = await startTestService({ sandbox_engine: 'process', http: { allowed_hosts: ['sandpod.internal', '*.svc.cluster.local'] } });
    server = await listen(svc, 0, '127.0.0.1');
    port = (server.address() as AddressInfo).port;
  }, 120_000);
  afterAll(async () => {
    await new Promise<void>((r) => server?.close(() => r()));
    await svc?.close();
  });

  it('lets the listed names in (any port), and nothing else', async () => {
    expect((await send(port, 'GET', '/executions', { host: 'sandpod.internal:8000' })).status).toBe(200);
    expect((await send(port, 'GET', '/executions', { host: 'sandpod.sandpod.svc.cluster.local' })).status).toBe(200);
    expect((await send(port, 'GET', '/executions', { host: 'sandpod.internal.attacker.example' })).status).toBe(403);
    expect((await send(port, 'GET', '/executions', REBOUND)).status).toBe(403);
  });
});

describe('with authentication', () => {
  const TOKEN = 'rebinding-test-token-0123456789';
  let svc: TestService;
  let server: ServerType;
  let port: number;
  beforeAll(async () => {
    svc = await startTestService({ sandbox_engine: 'process', auth: { tokens: [TOKEN] } });
    server = await listen(svc, 0, '127.0.0.1');
    port = (server.address() as AddressInfo).port;
  }, 120_000);
  afterAll(async () => {
    await new Promise<void>((r) => server?.close(() => r()));
    await svc?.close();
  });

  it('the token is the check: any Host (an ingress name) with a valid token is served, without one it is 401', async () => {
    expect((await send(port, 'GET', '/executions', { host: 'sandpod.example.com', authorization: `Bearer ${TOKEN}` })).status).toBe(200);
    expect((await send(port, 'GET', '/executions', { host: 'sandpod.example.com' })).status).toBe(401);
    expect((await send(port, 'POST', '/execute', { host: 'sandpod.example.com', 'content-type': 'text/plain', authorization: `Bearer ${TOKEN}` }, 'x')).status).toBe(415);
  });
});
