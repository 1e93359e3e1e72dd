import type { Kysely } from 'kysely';

/**
 * A transient fault must not fail queued work for good (issue 22 item 4):
 *
 * - `run_after`: a queued job given back after an infrastructure fault is not claimed before this
 *   time (the backoff between its attempts); null for work that may run at once.
 * - `infra_failures`: how many times the machinery failed this job before its code started (bounded:
 *   past the bound it fails like any other engine failure).
 * - `failed_before_start`: set on a job that ended `failed` by an infrastructure error before its code
 *   started; its idempotency key may be submitted again.
 * - `retired_idempotency_key`: where such a job's key goes when it is submitted again, so that the
 *   unique key names the new job while the old record still shows the key it was created with.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .alterTable('executions')
    .addColumn('run_after', 'timestamptz')
    .addColumn('infra_failures', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('failed_before_start', 'boolean', (c) => c.notNull().defaultTo(false))
    .addColumn('retired_idempotency_key', 'text')
    .execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema
    .alterTable('executions')
    .dropColumn('run_after')
    .dropColumn('infra_failures')
    .dropColumn('failed_before_start')
    .dropColumn('retired_idempotency_key')
    .execute();
}
