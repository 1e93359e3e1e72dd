import type { Kysely } from 'kysely';

/**
 * A session's hand-over between live replicas (issue 19, Kubernetes): a replica that gets a request
 * for a session another live replica holds asks for it here (`handoff_to`, its own id); the holder
 * lets the session go between cells (its row released) and the asker adopts its pod.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').addColumn('handoff_to', 'text').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('sessions').dropColumn('handoff_to').execute();
}
