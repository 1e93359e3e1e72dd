import type { Kysely } from 'kysely';

/**
 * One trace per run (issue 21): the run's trace crosses the queue and restarts with its record.
 *
 * - `traceparent`: the W3C traceparent of the span the run continues (the submitting request's, or
 *   the one the client sent); the holder that runs the job starts the run's span under it.
 * - `trace_id`: its trace id alone, shown in the record (`view=full`) and the logs, and searchable.
 *
 * Both null for runs submitted while tracing was off and without a `traceparent` header.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('executions').addColumn('traceparent', 'text').addColumn('trace_id', 'text').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('executions').dropColumn('traceparent').dropColumn('trace_id').execute();
}
