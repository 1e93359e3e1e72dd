import { sql, type Kysely } from 'kysely';

/**
 * Liveness leases of the processes that hold running records (src/queue/leases.ts): one row per
 * process (`holder` is its `claimed_by` value), renewed on the database's clock. Another process
 * takes over a holder's runs only once its lease has expired by the database's clock, so a replica
 * that is slow (CPU-starved, paused) but alive keeps its runs, and clocks of different machines never
 * meet in one comparison.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .createTable('holder_leases')
    .addColumn('holder', 'text', (c) => c.primaryKey())
    .addColumn('expires_at', 'timestamptz', (c) => c.notNull())
    .addColumn('renewed_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.dropTable('holder_leases').execute();
}
