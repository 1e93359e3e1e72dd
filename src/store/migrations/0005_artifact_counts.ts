import { type Kysely } from 'kysely';

/**
 * What a run wrote to `/output`, beyond what was listed (issue 22): only the first
 * `MAX_ARTIFACT_ENTRIES` entries become artifact rows, so a record says how many entries there were
 * (`artifacts_total`) and whether the list is incomplete (`artifacts_truncated`). Records from before
 * this migration have a null count (unknown; the view shows the listed count) and are not flagged.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .alterTable('executions')
    .addColumn('artifacts_total', 'integer')
    .addColumn('artifacts_truncated', 'boolean', (c) => c.notNull().defaultTo(false))
    .execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('executions').dropColumn('artifacts_total').dropColumn('artifacts_truncated').execute();
}
