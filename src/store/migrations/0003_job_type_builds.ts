import { sql, type Kysely } from 'kysely';

/**
 * Job-type builds (SPEC §4.9, issue #11): one row per build. A row `building` is the lease that makes
 * two replicas agree — at most one build of a job type's inputs at a time (the partial unique index);
 * the others wait for it and answer with its result. `built` rows are the environments runs pin to.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('job_type_builds')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('job_type', 'text', (c) => c.notNull())
    /** Hash of the build's inputs before resolution (requirements, interpreter, pip settings). */
    .addColumn('input_key', 'text', (c) => c.notNull())
    .addColumn('status', 'text', (c) => c.notNull())
    .addColumn('version_tag', 'text')
    .addColumn('requirements', 'json', (c) => c.notNull())
    .addColumn('python_version', 'text', (c) => c.notNull())
    .addColumn('phase', 'text', (c) => c.notNull())
    .addColumn('digest', 'text')
    .addColumn('image_ref', 'text')
    .addColumn('lock', 'json')
    .addColumn('error', 'text')
    .addColumn('owner', 'text', (c) => c.notNull())
    .addColumn('heartbeat_at', 'timestamptz', (c) => c.notNull())
    .addColumn('created_at', 'timestamptz', (c) => c.notNull())
    .addColumn('finished_at', 'timestamptz')
    .addColumn('duration_ms', 'integer')
    .execute();
  await sql`CREATE UNIQUE INDEX job_type_builds_one_building ON job_type_builds (job_type, input_key) WHERE status = 'building'`.execute(db);
  await sql`CREATE INDEX job_type_builds_latest ON job_type_builds (job_type, finished_at DESC) WHERE status = 'built'`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('job_type_builds').execute();
}
