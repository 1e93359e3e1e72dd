import type { Kysely } from 'kysely';

/**
 * What a process needs to take over a session another process held (issue 19, a cluster's session
 * pods outlive their service process): the session's own requirements (its cells' records carry
 * them), as a JSON array of strings. Older rows have none (null: none known).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').addColumn('requirements', 'text').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').dropColumn('requirements').execute();
}
