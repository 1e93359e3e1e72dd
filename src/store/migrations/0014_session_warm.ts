import type { Kysely } from 'kysely';

/**
 * Whether a session's sandbox came ready from the runtime's session pool (issue 19: "a sandbox, from
 * the warm pool when one is ready"), shown as `warm` on GET /sessions/{id} and in the list. False for
 * rows from before it, and while a session starts.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').addColumn('warm', 'boolean', (c) => c.notNull().defaultTo(false)).execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').dropColumn('warm').execute();
}
