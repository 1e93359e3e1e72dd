/**
 * Admission to the durable queue against `max_queue_size` (SPEC §8: when full, 503), atomic across
 * requests and across processes sharing the database: the count of active jobs and the insert of the
 * admitted ones happen in one transaction that holds a transaction-scoped advisory lock, so two
 * admissions never both count the same free room. Advisory locks are plain PostgreSQL, so PGlite (one
 * session; its transactions are serial anyway) behaves the same.
 *
 * Cost: one short transaction per batch of submissions (the submission batcher coalesces concurrent
 * ones), and admissions of all processes take turns for the length of a count and an insert.
 */
import { sql, type Kysely, type Transaction } from 'kysely';
import type { Database } from '../store/database.ts';
import { activeCountUpTo, queueCounts } from '../store/executions.repository.ts';

/** The advisory lock key that serializes admissions (an arbitrary constant of this service: "sandpod"). */
export const ADMISSION_LOCK_KEY = 0x73_61_6e_64_70_6f_64n;

/** The queue's depth at the moment of an admission that found it full (for the 503's body). */
export interface QueueDepth {
  queued: number;
  running: number;
}

/**
 * Runs `write` under the admission lock with the room left in the queue (`max_queue_size` minus
 * queued and running jobs, all processes). `write` inserts at most `room` jobs in `tx`; the lock is
 * held until the transaction commits, so the next admission counts them.
 */
export async function underAdmission<T>(db: Kysely<Database>, max: number, write: (tx: Transaction<Database>, room: number, depth: () => Promise<QueueDepth>) => Promise<T>): Promise<T> {
  return db.transaction().execute(async (tx) => {
    await sql`SELECT pg_advisory_xact_lock(${ADMISSION_LOCK_KEY.toString()}::bigint)`.execute(tx);
    const active = await activeCountUpTo(tx, max);
    return write(tx, Math.max(0, max - active), () => queueCounts(tx));
  });
}
