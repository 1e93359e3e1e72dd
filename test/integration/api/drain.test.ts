/**
 * SIGTERM's drain over a real socket (issue 22 item 8): while running work finishes, the listener stays
 * open — new submissions are answered 503 `shutting_down` with `Retry-After` and the error body,
 * `/health` says `draining`, `/readyz` 503, reads of jobs are served — and only after the last run
 * ended does the port stop accepting. Every request uses a fresh connection (no agent), so an answer
 * proves the listener accepted it.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { drainAndClose } from '../../../src/drain.ts';
import { createDb } from '../../../src/store/database.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { listen, startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
type Answer = { status: number; headers: http.IncomingHttpHeaders; body: J };

/** One request on a new TCP connection; rejects with the socket error (ECONNREFUSED once closed). */
function request(port: number, method: string, p: string, body?: unknown): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request(
      { host: '127.0.0.1', port, method, path: p, agent: false, headers: data ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } : {} },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text ? (JSON.parse(text) as J) : {} }));
      },
    );
    req.on('error', reject);
    req.end(data);
  });
}

describe('SIGTERM drain over a real socket', () => {
  let database: TestDatabase;
  let svc: TestService;
  let port: number;
  beforeAll(async () => {
    database = await freshDatabase();
    svc = await startTestService({ max_workers: 1, shutdown_grace_seconds: 30 }, {}, database);
    const server = await listen(svc, 0, '127.0.0.1');
    port = (server.address() as AddressInfo).port;
    (svc as unknown as { server: typeof server }).server = server;
  }, 120_000);
  afterAll(async () => {
    await database?.drop();
  });

  it('keeps answering (503 for new work, reads served) until the running job ended, then refuses', async () => {
    const server = (svc as unknown as { server: Parameters<typeof drainAndClose>[1] }).server;
    const running = await request(port, 'POST', '/execute/async', { code: 'import time\ntime.sleep(3)\nprint("done")' });
    expect(running.status).toBe(202);
    const queued = await request(port, 'POST', '/execute/async', { code: 'print("later")' });
    for (const deadline = Date.now() + 30_000; (await request(port, 'GET', `/jobs/${running.body.job_id}`)).body.status !== 'running'; ) {
      if (Date.now() > deadline) throw new Error('the job never started');
      await new Promise((r) => setTimeout(r, 50));
    }

    // A sync run in flight (it waits for the slot, then runs): answered in full during the drain.
    const sync = request(port, 'POST', '/execute', { code: 'import time\ntime.sleep(1)\nprint("sync")' });
    await new Promise((r) => setTimeout(r, 100));

    let drained = false;
    const drain = drainAndClose(svc, server, { graceMs: 30_000 }).then(() => (drained = true));
    await new Promise((r) => setTimeout(r, 200));

    for (const [p, body] of [
      ['/execute/async', { code: 'print(1)' }],
      ['/execute', { code: 'print(1)' }],
      [`/jobs/${running.body.job_id}/rerun`, undefined],
    ] as const) {
      const r = await request(port, 'POST', p, body);
      expect(r.status, p).toBe(503);
      expect(r.headers['retry-after'], p).toBe('2');
      expect(r.body, p).toMatchObject({ code: 'shutting_down', detail: expect.any(String), correlation_id: expect.any(String) });
    }
    const health = await request(port, 'GET', '/health');
    expect(health.status).toBe(503);
    expect(health.body).toMatchObject({ status: 'draining', reasons: [expect.stringMatching(/draining/)] });
    expect((await request(port, 'GET', '/readyz')).body).toEqual({ status: 'shutting_down' });
    const read = await request(port, 'GET', `/jobs/${running.body.job_id}`);
    expect(read.status).toBe(200);
    expect(read.body.status).toBe('running');
    expect(drained).toBe(false);

    const syncAnswer = await sync;
    expect(syncAnswer.status).toBe(200);
    expect(syncAnswer.body).toMatchObject({ success: true, stdout: 'sync\n' });
    await drain;
    await expect(request(port, 'GET', '/livez')).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    const db = await createDb({ url: database.url, workspace: database.workspace });
    try {
      const rows = await db.kysely.selectFrom('executions').select(['id', 'status', 'stdout']).where('id', 'in', [running.body.job_id, queued.body.job_id]).execute();
      const byId = Object.fromEntries(rows.map((r) => [r.id, r]));
      expect(byId[running.body.job_id]).toMatchObject({ status: 'succeeded', stdout: 'done\n' });
      expect(byId[queued.body.job_id]).toMatchObject({ status: 'queued' });
      expect(rows).toHaveLength(2);
      // Nothing submitted during the drain was recorded: the three jobs above and the sync run only.
      expect((await db.kysely.selectFrom('executions').select('id').execute()).length).toBe(3);
    } finally {
      await db.destroy();
    }
  }, 90_000);
});
