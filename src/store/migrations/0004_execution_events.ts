import { sql, type Kysely } from 'kysely';

/**
 * The event log of runs (issue 12, `GET /jobs/{id}/events`): phase changes and output chunks as the
 * process holding a run writes them, read by every replica after a `Last-Event-ID`. `id` is the
 * event id a client resumes from (increasing per run; one writer per run at a time). Output is capped
 * per run like the record (`max_stdout_bytes` per stream), so a run's rows are bounded; they go with
 * the record (cascade).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('execution_events')
    .addColumn('id', 'bigserial', (c) => c.primaryKey())
    .addColumn('execution_id', 'text', (c) => c.notNull().references('executions.id').onDelete('cascade'))
    .addColumn('kind', 'text', (c) => c.notNull())
    /** The event's JSON text (`json` keeps NUL as `\u0000`, which `text` cannot hold). */
    .addColumn('data', 'json', (c) => c.notNull())
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
  await sql`CREATE INDEX execution_events_by_run ON execution_events (execution_id, id)`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('execution_events').execute();
}
