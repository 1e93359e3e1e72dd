/**
 * Crash-recovery rule (DESIGN "data that must never be lost"): a run whose holder died is re-queued
 * when user code never started, and failed (internal_error, DLQ) when it had. The dead holder is a
 * record left exactly as a killed process leaves it.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { hostname } from 'node:os';
import { freshDatabase } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { createDb } from '../../../src/store/database.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import { orphanRow } from '../../support/rows.ts';

type J = Record<string, any>;

const services: TestService[] = [];
afterAll(async () => {
  for (const s of services) {
    await s.close();
    await s.database.drop();
  }
});

describe('orphaned runs', () => {
  it('startup-phase orphans are re-queued and run; execution-phase orphans fail into the DLQ', async () => {
    const database = await freshDatabase();
    const db = await createDb({ url: database.url, workspace: database.workspace });
    await migrateToLatest(db.kysely);
    const deadHolder = `${hostname()}/999999/dead`; // no such pid on this host
    await db.kysely.insertInto('executions').values([orphanRow('orphan-startup', 'startup', 'print("again")', deadHolder), orphanRow('orphan-exec', 'execution', 'print("x")', deadHolder)]).execute();
    await db.destroy();

    const svc = await startTestService({}, {}, database);
    services.push(svc);
    const r1 = (await (await svc.get('/jobs/orphan-startup/result?wait=true&timeout=30')).json()) as J;
    expect(r1).toMatchObject({ status: 'succeeded', stdout: 'again\n' });
    const r2 = (await (await svc.get('/jobs/orphan-exec/result?wait=true&timeout=30')).json()) as J;
    expect(r2).toMatchObject({ status: 'failed', error: { type: 'internal_error' } });
    const dlq = (await (await svc.get('/dlq')).json()) as J;
    expect(dlq.items.map((e: J) => e.job_id)).toContain('orphan-exec');
    expect(dlq.items.map((e: J) => e.job_id)).not.toContain('orphan-startup');
  });
});

describe('orphans of a replica that dies while this one runs', () => {
  it('are taken over by the periodic sweep, without a restart', async () => {
    const svc = await startTestService({}, { heartbeatMs: 200 });
    services.push(svc);
    await svc.db.kysely
      .insertInto('executions')
      .values({ ...orphanRow('orphan-late', 'startup', 'print("swept")', 'other-host/1/gone'), heartbeat_at: new Date(Date.now() - 60_000) })
      .execute();
    const r = (await (await svc.get('/jobs/orphan-late/result?wait=true&timeout=30')).json()) as J;
    expect(r).toMatchObject({ status: 'succeeded', stdout: 'swept\n' });
  });
});
