/**
 * `max_queue_size` under concurrency (issue 22 item 5): 600 submissions at once, spread over two
 * service instances sharing one PostgreSQL database (on PGlite, one instance: its database is one
 * process's), with and without idempotency keys. Exactly the bound is admitted (202); every other
 * submission is the 503 `queue_full` of SPEC §8 with the error body. Nothing is dispatched, so the
 * queue only fills.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;

describe('admission against max_queue_size', () => {
  let database: TestDatabase;
  const services: TestService[] = [];
  beforeAll(async () => {
    database = await freshDatabase();
    const on = (name: string): TestDatabase => {
      const workspace = path.join(database.workspace, name);
      mkdirSync(workspace, { recursive: true, mode: 0o755 });
      return { ...database, workspace, drop: async () => {} };
    };
    const cfg = { dispatch: false, max_queue_size: 20 };
    services.push(await startTestService(cfg, { heartbeatMs: 120_000 }, on('a')));
    if (database.kind === 'postgres') services.push(await startTestService(cfg, { heartbeatMs: 120_000 }, on('b')));
  }, 120_000);
  afterAll(async () => {
    for (const s of services) await s.close();
    await database?.drop();
  });

  it('600 concurrent submissions: exactly 20 accepted, the rest 503 queue_full', async () => {
    const answers = await Promise.all(
      Array.from({ length: 600 }, async (_, i) => {
        const svc = services[i % services.length]!;
        const res = await svc.post('/execute/async', { code: `print(${i})`, ...(i % 4 === 0 ? { idempotency_key: `adm-${i}` } : {}) });
        return { status: res.status, retryAfter: res.headers.get('retry-after'), body: (await res.json()) as J };
      }),
    );
    const accepted = answers.filter((a) => a.status === 202);
    const refused = answers.filter((a) => a.status !== 202);
    expect(accepted).toHaveLength(20);
    expect(new Set(accepted.map((a) => a.body.job_id)).size).toBe(20);
    expect(refused).toHaveLength(580);
    for (const r of refused) {
      expect(r.status).toBe(503);
      expect(r.retryAfter).toBe('5');
      expect(r.body).toMatchObject({ code: 'queue_full', max_queue_size: 20, queued: 20, running: 0, correlation_id: expect.any(String) });
    }
    const stored = await services[0]!.db.kysely.selectFrom('executions').select('id').execute();
    expect(stored.map((r) => r.id).sort()).toEqual(accepted.map((a) => a.body.job_id).sort());
  }, 120_000);
});
