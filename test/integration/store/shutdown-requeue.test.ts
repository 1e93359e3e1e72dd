/**
 * Issue #9 (c): when the shutdown grace runs out, async jobs still running go back to the queue as
 * if never started (SPEC §3 `queued`, no holder), and the next process runs them to the end; a sync
 * run caught the same way fails instead (its caller is gone with the process).
 */
import { afterAll, describe, expect, it } from 'vitest';
import { createDb } from '../../../src/store/database.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const SLOW = 'import time\nprint("started", flush=True)\ntime.sleep(4)\nprint("finished")';

let database: TestDatabase | undefined;
const open: TestService[] = [];
afterAll(async () => {
  for (const s of open) await s.close();
  await database?.drop();
});

async function until<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`condition not met: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('shutdown grace running out', () => {
  it('puts running async jobs back in the queue; the next process runs them', async () => {
    database = await freshDatabase();
    const first = await startTestService({ max_workers: 2 }, {}, database);
    const { row } = await first.executions.submitAsync({ code: SLOW, input_data: {}, job_type: 'default' }, { correlationId: 'c', clientIp: null });
    const sync = first.executions.runSync({ code: SLOW, input_data: {}, job_type: 'default' }, { correlationId: 's', clientIp: null });
    const read = (id: string) => first.db.kysely.selectFrom('executions').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
    await until(() => read(row.id), (r) => r.status === 'running' && r.phase === 'execution');

    // 300 ms of grace for a 4 s job: it cannot finish in time.
    const t0 = Date.now();
    await first.stop(300);
    expect(Date.now() - t0).toBeLessThan(3000);
    const syncDone = await sync;
    expect(syncDone.status).toBe('cancelled');

    const db = await createDb({ url: database.url, workspace: database.workspace });
    try {
      const back = await db.kysely.selectFrom('executions').selectAll().where('id', '=', row.id).executeTakeFirstOrThrow();
      expect(back).toMatchObject({ status: 'queued', claimed_by: null, started_at: null, heartbeat_at: null, phase: null, attempts: 1, ended_at: null });
    } finally {
      await db.destroy();
    }

    const next = await startTestService({}, {}, database);
    open.push(next);
    const done = await until(
      () => next.db.kysely.selectFrom('executions').selectAll().where('id', '=', row.id).executeTakeFirstOrThrow(),
      (r) => r.status !== 'queued' && r.status !== 'running',
    );
    expect(done).toMatchObject({ status: 'succeeded', stdout: 'started\nfinished\n', attempts: 2 });
  });
});
