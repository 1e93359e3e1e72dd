/**
 * Migrations land in any order (numbers are handed out before the work is done): a database that ran
 * a higher number first still takes a lower one that arrives later, instead of refusing to start.
 */
import { Migrator, type Migration } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createDb, type Db } from '../../../src/store/database.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import * as m0001 from '../../../src/store/migrations/0001_initial.ts';
import * as m0002 from '../../../src/store/migrations/0002_json_fidelity.ts';
import * as m0003 from '../../../src/store/migrations/0003_job_type_builds.ts';
import * as m0004 from '../../../src/store/migrations/0004_execution_events.ts';
import * as m0006 from '../../../src/store/migrations/0006_queue_faults.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';

let database: TestDatabase;
let db: Db;
beforeAll(async () => {
  database = await freshDatabase();
  db = await createDb({ url: database.url, workspace: database.workspace });
});
afterAll(async () => {
  await db?.destroy();
  await database?.drop();
});

it('applies 0005 to a database that already ran 0006', async () => {
  const without0005: Record<string, Migration> = { '0001_initial': m0001, '0002_json_fidelity': m0002, '0003_job_type_builds': m0003, '0004_execution_events': m0004, '0006_queue_faults': m0006 };
  const earlier = new Migrator({ db: db.kysely, provider: { getMigrations: async () => without0005 }, migrationTableName: 'sandpod_migrations', migrationLockTableName: 'sandpod_migrations_lock' });
  expect((await earlier.migrateToLatest()).error).toBeUndefined();
  await migrateToLatest(db.kysely);
  const applied = await db.kysely.selectFrom('sandpod_migrations' as never).select('name' as never).execute();
  expect(applied.map((r) => (r as { name: string }).name).sort()).toContain('0005_artifact_counts');
  const cols = await db.kysely.introspection.getTables();
  const executions = cols.find((t) => t.name === 'executions')!;
  expect(executions.columns.map((c) => c.name)).toEqual(expect.arrayContaining(['artifacts_total', 'artifacts_truncated', 'run_after']));
});
