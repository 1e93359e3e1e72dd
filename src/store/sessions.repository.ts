/** Sessions (issue 19): rows, guarded status changes, the live count for admission, pages. */
import { sql } from 'kysely';
import type { Insertable, Kysely, Updateable } from 'kysely';
import type { Database, ExecutionRow, SessionRow, SessionsTable } from './database.ts';
import type { Q } from './executions.repository.ts';

/** Inserts a session. */
export async function insertSession(db: Q, row: Insertable<SessionsTable>): Promise<SessionRow> {
  return db.insertInto('sessions').values(row).returningAll().executeTakeFirstOrThrow();
}

/** The advisory lock that serializes session admissions across processes ("sandpod" + "sess"). */
export const SESSION_ADMISSION_LOCK_KEY = 0x73616e64706f6473n;

/**
 * Inserts a session if `admit` (given the live count, across every process on the database) does not
 * throw: the count and the insert happen in one transaction holding {@link SESSION_ADMISSION_LOCK_KEY},
 * so two processes cannot both take the last place under `max_sessions`.
 */
export async function insertSessionAdmitted(db: Kysely<Database>, admit: (live: number) => void, row: Insertable<SessionsTable>): Promise<SessionRow> {
  return db.transaction().execute(async (tx) => {
    await sql`SELECT pg_advisory_xact_lock(${SESSION_ADMISSION_LOCK_KEY.toString()}::bigint)`.execute(tx);
    admit(await liveSessionCount(tx));
    return insertSession(tx, row);
  });
}

/** One session, or undefined. */
export async function getSession(db: Q, id: string): Promise<SessionRow | undefined> {
  if (id.includes('\u0000')) return undefined;
  return db.selectFrom('sessions').selectAll().where('id', '=', id).executeTakeFirst();
}

/** Live (not ended) sessions, all processes. */
export async function liveSessionCount(db: Q): Promise<number> {
  const r = await db.selectFrom('sessions').select(sql<string>`count(*)`.as('n')).where('status', '<>', 'ended').executeTakeFirstOrThrow();
  return Number(r.n);
}

/** Updates a live session; returns the row, or undefined when it had ended (or never existed). */
export async function updateLiveSession(db: Q, id: string, set: Updateable<SessionsTable>): Promise<SessionRow | undefined> {
  return db.updateTable('sessions').set(set).where('id', '=', id).where('status', '<>', 'ended').returningAll().executeTakeFirst();
}

/** Ends a session unless it has ended already; returns the row when this call ended it. */
export async function endSession(db: Q, id: string, reason: string, now: Date): Promise<SessionRow | undefined> {
  return updateLiveSession(db, id, { status: 'ended', end_reason: reason, ended_at: now, running_cell_id: null });
}

/** Live sessions (for the sweep: expiry and dead owners). */
export async function liveSessions(db: Q): Promise<SessionRow[]> {
  return db.selectFrom('sessions').selectAll().where('status', '<>', 'ended').execute();
}

/** Marks this owner's live sessions as alive. */
export async function heartbeatSessions(db: Q, owner: string, now: Date): Promise<void> {
  await db.updateTable('sessions').set({ heartbeat_at: now }).where('owner', '=', owner).where('status', '<>', 'ended').execute();
}

/** Newest first, a page (SPEC §2.8 shape is the caller's). */
export async function listSessions(db: Q, f: { status?: string | undefined; limit: number; offset: number }): Promise<{ rows: SessionRow[]; hasMore: boolean }> {
  let q = db.selectFrom('sessions').selectAll();
  if (f.status) q = q.where('status', '=', f.status);
  const rows = await q.orderBy('created_at', 'desc').orderBy('id', 'desc').limit(f.limit + 1).offset(f.offset).execute();
  return { rows: rows.slice(0, f.limit), hasMore: rows.length > f.limit };
}

/** The record of the session's first cell numbered `from` or later (a cell whose record was never written leaves a gap). */
export async function nextCellRecord(db: Q, sessionId: string, from: number): Promise<ExecutionRow | undefined> {
  return db.selectFrom('executions').selectAll().where('session_id', '=', sessionId).where('cell', '>=', from).orderBy('cell').limit(1).executeTakeFirst();
}

/** The owner a session has while no process holds it (its holder stopped and let it go for another to adopt). */
export const RELEASED_OWNER = '';

/**
 * Takes a live session from `from` (a process that is gone, or {@link RELEASED_OWNER}) for `to`;
 * returns the row when this call took it (of two processes trying, one gets it).
 */
export async function claimSession(db: Q, id: string, from: string, to: string, now: Date): Promise<SessionRow | undefined> {
  return db.updateTable('sessions').set({ owner: to, heartbeat_at: now, handoff_to: null }).where('id', '=', id).where('owner', '=', from).where('status', '<>', 'ended').returningAll().executeTakeFirst();
}

/** Lets go of this owner's live sessions (a graceful stop whose sandboxes live on): another process adopts them. */
export async function releaseSessions(db: Q, owner: string): Promise<number> {
  const r = await db.updateTable('sessions').set({ owner: RELEASED_OWNER }).where('owner', '=', owner).where('status', '<>', 'ended').executeTakeFirst();
  return Number(r.numUpdatedRows);
}

/** Of `ids`, the sessions that exist and have not ended. */
export async function liveSessionIds(db: Q, ids: string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await db.selectFrom('sessions').select('id').where('id', 'in', ids).where('status', '<>', 'ended').execute();
  return new Set(rows.map((r) => r.id));
}

/** Asks `from`, the live holder of a session, to let it go for `to` (it does so between cells). */
export async function requestHandoff(db: Q, id: string, from: string, to: string): Promise<void> {
  await db.updateTable('sessions').set({ handoff_to: to }).where('id', '=', id).where('owner', '=', from).where('status', '<>', 'ended').execute();
}

/** The holder lets one session go after a hand-over request: released for the asker to adopt. */
export async function releaseSession(db: Q, id: string, owner: string): Promise<void> {
  await db.updateTable('sessions').set({ owner: RELEASED_OWNER, handoff_to: null }).where('id', '=', id).where('owner', '=', owner).where('status', '<>', 'ended').execute();
}
