/**
 * A restart that finds many runs it cannot re-attach to (the local runtime never can) settles them
 * all without opening the circuit breaker: "nothing to re-attach to" says nothing about the engine,
 * so it does not count as an engine failure (the guard policy's neutral outcome).
 */
import { hostname } from 'node:os';
import { afterAll, describe, expect, it } from 'vitest';
import { createDb } from '../../../src/store/database.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { orphanRow } from '../../support/rows.ts';
import { startTestService, type TestService } from '../../support/service.ts';

let database: TestDatabase | undefined;
let svc: TestService | undefined;
afterAll(async () => {
  await svc?.close();
  await database?.drop();
});

describe('restart with more lost runs than the breaker threshold', () => {
  it('settles every one (failed, internal_error) and the breaker stays closed', async () => {
    database = await freshDatabase();
    const db = await createDb({ url: database.url, workspace: database.workspace });
    await migrateToLatest(db.kysely);
    const holder = `${hostname()}/999999/dead`; // no such pid on this host
    const ids = Array.from({ length: 7 }, (_, i) => `lost-${i}`);
    await db.kysely.insertInto('executions').values(ids.map((id) => orphanRow(id, 'execution', 'print(1)', holder))).execute();
    await db.destroy();

    svc = await startTestService({}, {}, database);
    const end = Date.now() + 30_000;
    let rows: { id: string; status: string; error: unknown }[] = [];
    while (Date.now() < end) {
      rows = await svc.db.kysely.selectFrom('executions').select(['id', 'status', 'error']).where('id', 'in', ids).execute();
      if (rows.every((r) => r.status !== 'running')) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(rows.map((r) => r.status)).toEqual(ids.map(() => 'failed'));
    expect(rows.every((r) => (r.error as { type: string }).type === 'internal_error')).toBe(true);
    expect(svc.breaker.snapshot()).toMatchObject({ state: 'closed', failure_count: 0 });
    const res = await svc.post('/execute', { code: 'print("engine fine")' });
    expect(((await res.json()) as { stdout: string }).stdout).toBe('engine fine\n');
  });
});
