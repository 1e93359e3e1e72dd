import { sql, type Kysely } from 'kysely';

/** Executions (records + durable queue), artifacts, dead letter queue. */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('executions')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('status', 'text', (c) => c.notNull())
    .addColumn('mode', 'text', (c) => c.notNull())
    .addColumn('job_type', 'text', (c) => c.notNull())
    .addColumn('job_version', 'text', (c) => c.notNull())
    .addColumn('job_ref', 'text', (c) => c.notNull())
    .addColumn('code', 'text', (c) => c.notNull())
    .addColumn('input_data', 'jsonb', (c) => c.notNull())
    .addColumn('code_hash', 'text', (c) => c.notNull())
    .addColumn('input_hash', 'text', (c) => c.notNull())
    .addColumn('timeout_s', 'integer', (c) => c.notNull())
    .addColumn('startup_timeout_s', 'integer', (c) => c.notNull())
    .addColumn('requirements', 'jsonb', (c) => c.notNull())
    .addColumn('idempotency_key', 'text')
    .addColumn('payload_hash', 'text')
    .addColumn('parent_execution_id', 'text')
    .addColumn('relationship', 'text')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('started_at', 'timestamptz')
    .addColumn('ended_at', 'timestamptz')
    .addColumn('duration_ms', 'integer')
    .addColumn('exit_code', 'integer')
    .addColumn('stdout', 'text')
    .addColumn('stderr', 'text')
    .addColumn('stdout_truncated', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('stderr_truncated', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('output', 'jsonb')
    .addColumn('error', 'jsonb')
    .addColumn('timing', 'jsonb')
    .addColumn('resource_usage', 'jsonb')
    .addColumn('phase', 'text')
    .addColumn('claimed_by', 'text')
    .addColumn('heartbeat_at', 'timestamptz')
    .addColumn('cancel_requested', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('client_ip', 'text')
    .addColumn('correlation_id', 'text')
    .execute();
  // Idempotency: one job per key, enforced by the database so concurrent submissions cannot race.
  await sql`CREATE UNIQUE INDEX executions_idempotency_key ON executions (idempotency_key) WHERE idempotency_key IS NOT NULL`.execute(db);
  // The queue: oldest queued first.
  await sql`CREATE INDEX executions_queued ON executions (created_at, id) WHERE status = 'queued'`.execute(db);
  // Runs in flight, for recovery and the running count.
  await sql`CREATE INDEX executions_running ON executions (claimed_by) WHERE status = 'running'`.execute(db);
  // History: newest first, optionally filtered by status or job type.
  await sql`CREATE INDEX executions_history ON executions (created_at DESC, id DESC)`.execute(db);
  await sql`CREATE INDEX executions_history_status ON executions (status, created_at DESC, id DESC)`.execute(db);
  await sql`CREATE INDEX executions_history_job_type ON executions (job_type, created_at DESC, id DESC)`.execute(db);

  await db.schema
    .createTable('artifacts')
    .addColumn('execution_id', 'text', (c) => c.notNull().references('executions.id').onDelete('cascade'))
    .addColumn('kind', 'text', (c) => c.notNull())
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('size_bytes', 'bigint', (c) => c.notNull())
    .addColumn('sha256', 'text', (c) => c.notNull())
    .addColumn('content_type', 'text', (c) => c.notNull())
    .addColumn('data', 'bytea')
    .addColumn('skipped', 'text')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addPrimaryKeyConstraint('artifacts_pk', ['execution_id', 'kind', 'name'])
    .execute();

  await db.schema
    .createTable('dlq')
    .addColumn('id', 'bigserial', (c) => c.primaryKey())
    .addColumn('job_id', 'text', (c) => c.notNull())
    .addColumn('job_data', 'jsonb', (c) => c.notNull())
    .addColumn('error_type', 'text', (c) => c.notNull())
    .addColumn('error_message', 'text', (c) => c.notNull())
    .addColumn('retry_count', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('client_ip', 'text')
    .addColumn('correlation_id', 'text')
    .execute();
  await sql`CREATE INDEX dlq_error_type ON dlq (error_type, id DESC)`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('dlq').execute();
  await db.schema.dropTable('artifacts').execute();
  await db.schema.dropTable('executions').execute();
}
