/**
 * Migrations: ordered files under `migrations/`, applied with kysely's Migrator. `npm run migrate`
 * (a Helm hook in the cluster) runs them; the embedded default migrates at start.
 */
import { Migrator, type Kysely, type Migration, type MigrationProvider } from 'kysely';
import * as m0001 from './migrations/0001_initial.ts';
import * as m0002 from './migrations/0002_json_fidelity.ts';
import * as m0003 from './migrations/0003_job_type_builds.ts';
import * as m0004 from './migrations/0004_execution_events.ts';
import * as m0005 from './migrations/0005_artifact_counts.ts';
import * as m0006 from './migrations/0006_queue_faults.ts';
import * as m0007 from './migrations/0007_webhooks.ts';
import * as m0008 from './migrations/0008_trace_id.ts';
import * as m0009 from './migrations/0009_input_files.ts';
import * as m0010 from './migrations/0010_sessions.ts';
import * as m0011 from './migrations/0011_holder_leases.ts';
import * as m0012 from './migrations/0012_session_adoption.ts';
import * as m0013 from './migrations/0013_session_handoff.ts';
import * as m0014 from './migrations/0014_session_warm.ts';

/** Static provider: migrations are imported, so bundling and tsx both find them. */
const provider: MigrationProvider = {
  async getMigrations(): Promise<Record<string, Migration>> {
    return {
      '0001_initial': m0001,
      '0002_json_fidelity': m0002,
      '0003_job_type_builds': m0003,
      '0004_execution_events': m0004,
      '0005_artifact_counts': m0005,
      '0006_queue_faults': m0006,
      '0007_webhooks': m0007,
      '0008_trace_id': m0008,
      '0009_input_files': m0009,
      '0010_sessions': m0010,
      '0011_holder_leases': m0011,
      '0012_session_adoption': m0012,
      '0013_session_handoff': m0013,
      '0014_session_warm': m0014,
    };
  },
};

/** Applies every pending migration; throws with the failing migration's error. */
export async function migrateToLatest(db: Kysely<any>): Promise<void> {
  // Numbers are handed out before the work lands, so a database can have run 0006 before 0005
  // existed; each migration stands alone, so a late lower number is applied rather than refused.
  const migrator = new Migrator({
    db,
    provider,
    migrationTableName: 'sandpod_migrations',
    migrationLockTableName: 'sandpod_migrations_lock',
    allowUnorderedMigrations: true,
  });
  const { error, results } = await migrator.migrateToLatest();
  const failed = results?.find((r) => r.status === 'Error');
  if (error) throw new Error(`migration ${failed?.migrationName ?? ''} failed: ${(error as Error).message ?? String(error)}`);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { loadConfig } = await import('../config.ts');
  const { createDb } = await import('./database.ts');
  const config = loadConfig();
  const db = await createDb({ url: config.database_url, workspace: config.workspace });
  try {
    await migrateToLatest(db.kysely);
    console.log(JSON.stringify({ msg: 'migrations applied', database: db.kind }));
  } finally {
    await db.destroy();
  }
}
