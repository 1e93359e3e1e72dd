import { sql, type Kysely } from 'kysely';

/**
 * Sessions (issue 19): a session's row (settings, status, why it ended, its owner and the owner's
 * heartbeat, so expiry and a dead owner's sessions are settled by whoever runs next), and on
 * `executions` the session and cell number of a cell's record (`relationship` is `session`).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('sessions')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('status', 'text', (c) => c.notNull())
    .addColumn('end_reason', 'text')
    .addColumn('job_type', 'text', (c) => c.notNull())
    .addColumn('idle_timeout_s', 'integer', (c) => c.notNull())
    .addColumn('max_lifetime_s', 'integer', (c) => c.notNull())
    .addColumn('cell_timeout_s', 'integer', (c) => c.notNull())
    .addColumn('cells', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('running_cell_id', 'text')
    .addColumn('owner', 'text', (c) => c.notNull())
    .addColumn('heartbeat_at', 'timestamptz', (c) => c.notNull())
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('last_used_at', 'timestamptz', (c) => c.notNull())
    .addColumn('ended_at', 'timestamptz')
    .addColumn('client_ip', 'text')
    .addColumn('correlation_id', 'text')
    .execute();
  await sql`CREATE INDEX sessions_live ON sessions (status) WHERE status <> 'ended'`.execute(db);
  await db.schema.alterTable('executions').addColumn('session_id', 'text').addColumn('cell', 'integer').execute();
  await sql`CREATE INDEX executions_session ON executions (session_id, cell) WHERE session_id IS NOT NULL`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropIndex('executions_session').execute();
  await db.schema.alterTable('executions').dropColumn('session_id').dropColumn('cell').execute();
  await db.schema.dropTable('sessions').execute();
}
