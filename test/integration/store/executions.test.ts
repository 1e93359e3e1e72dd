/**
 * The batched insert of async submissions: rows come back in the order given, and with a channel the
 * same statement wakes that channel's listeners — once per batch — on PostgreSQL and on PGlite.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb, type Db, type NewExecutionRow } from '../../../src/store/database.ts';
import { insertExecutions } from '../../../src/store/executions.repository.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';

let database: TestDatabase;
let listener: Db;
let writer: Db;
beforeAll(async () => {
  database = await freshDatabase();
  listener = await createDb({ url: database.url, workspace: database.workspace });
  await migrateToLatest(listener.kysely);
  writer = database.url ? await createDb({ url: database.url, workspace: database.workspace }) : listener;
});
afterAll(async () => {
  if (writer !== listener) await writer?.destroy();
  await listener?.destroy();
  await database?.drop();
});

function row(id: string): NewExecutionRow {
  return {
    id,
    status: 'queued',
    mode: 'async',
    job_type: 'default',
    job_version: 'latest',
    job_ref: 'default@latest',
    code: `print(${JSON.stringify(id)})`,
    input_data: JSON.stringify({}),
    code_hash: 'h',
    input_hash: 'h',
    timeout_s: 30,
    startup_timeout_s: 60,
    requirements: JSON.stringify([]),
  } as NewExecutionRow;
}

describe('insertExecutions', () => {
  it('returns the rows in the order given, and the statement itself notifies the channel once', async () => {
    const got: string[] = [];
    const unlisten = await listener.listen('test_queued', (p) => got.push(p));
    try {
      const out = await insertExecutions(writer.kysely, [row('b-2'), row('b-1'), row('b-3')], 'test_queued');
      expect(out.map((r) => r.id)).toEqual(['b-2', 'b-1', 'b-3']);
      expect(out.map((r) => r.status)).toEqual(['queued', 'queued', 'queued']);
      expect(out.every((r) => !('_notified' in r))).toBe(true);
      const end = Date.now() + 5_000;
      while (got.length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      await new Promise((r) => setTimeout(r, 200));
      // Identical payloads in one transaction are delivered once.
      expect(got).toEqual(['']);
      // Without a channel: no notification.
      await insertExecutions(writer.kysely, [row('c-1')]);
      await new Promise((r) => setTimeout(r, 300));
      expect(got).toEqual(['']);
    } finally {
      await unlisten();
    }
  });
});
