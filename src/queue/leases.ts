/**
 * Holder leases: whether the process that holds a running record is alive, judged on the database's
 * clock only. Every process renews one row (`holder_leases`, its `claimed_by` value) each heartbeat
 * period to `now() + lease`; another process takes its runs over only once that row has expired by
 * the database's `now()` — never by comparing a time the holder wrote with its own clock against the
 * sweeper's clock, and never after a few missed heartbeats: a CPU-starved or paused replica is slow,
 * not dead, and taking its runs while it still runs them runs the program twice.
 *
 * The takeover of an expired holder's runs happens in one transaction that locks the holder's lease
 * row (`FOR UPDATE`) and checks the expiry again, so it cannot interleave with the holder's own renewal:
 * either the renewal lands first (nothing is taken), or the takeover commits first and the holder,
 * whose renewal then reports the lapse, learns which runs it lost before it does anything else
 * (holders.ts: fencing).
 */
import { sql } from 'kysely';
import type { Db, ExecutionRow } from '../store/database.ts';
import type { Q } from '../store/executions.repository.ts';

/** Facts about the holder of one running record, times by the database's clock. */
export interface HolderFacts {
  holder: string | null;
  /** When the holder's lease expires; null when it has no lease row (a process from before leases). */
  leaseExpiresAt: Date | null;
  /** The record's last heartbeat (only consulted without a lease row). */
  heartbeatAt: Date | null;
  /** The database's `now()` when these were read. */
  dbNow: Date;
  /** The holder names a process of this host that no longer exists (holders.ts `holderIsDeadHere`). */
  deadHere: boolean;
}

/**
 * Why a holder counts as dead, or `alive`:
 * - `unheld`: a running record nobody holds;
 * - `gone`: a process of this host that no longer exists;
 * - `lease_expired`: its lease expired by the database's clock;
 * - `silent`: no lease row at all (a process of a version before leases, during a rolling update) and
 *   the record's own heartbeat is older than the lease duration.
 */
export type HolderVerdict = 'alive' | 'unheld' | 'gone' | 'lease_expired' | 'silent';

/** The pure rule (see {@link HolderVerdict}); `leaseMs` is the lease duration. */
export function judgeHolder(f: HolderFacts, leaseMs: number): HolderVerdict {
  if (!f.holder) return 'unheld';
  if (f.deadHere) return 'gone';
  const now = f.dbNow.getTime();
  if (f.leaseExpiresAt) return now >= f.leaseExpiresAt.getTime() ? 'lease_expired' : 'alive';
  if (f.heartbeatAt === null || now - f.heartbeatAt.getTime() >= leaseMs) return 'silent';
  return 'alive';
}

/** Renewal result: whether the lease had expired before this renewal (the holder may have lost runs). */
export interface Renewal {
  lapsed: boolean;
}

/**
 * Renews (or creates) `holder`'s lease to the database's `now() + leaseMs`. Waits while another
 * process is taking this holder's runs over (it holds the row's lock), and reports the lapse then.
 */
export async function renewLease(db: Q, holder: string, leaseMs: number): Promise<Renewal> {
  const res = await sql<{ previous: Date | null; db_now: Date }>`
    WITH prev AS (SELECT expires_at FROM holder_leases WHERE holder = ${holder})
    INSERT INTO holder_leases (holder, expires_at, renewed_at)
    VALUES (${holder}, now() + ${leaseMs}::double precision * interval '1 millisecond', now())
    ON CONFLICT (holder) DO UPDATE SET expires_at = EXCLUDED.expires_at, renewed_at = EXCLUDED.renewed_at
    RETURNING (SELECT expires_at FROM prev) AS previous, now() AS db_now`.execute(db);
  const r = res.rows[0];
  const previous = r?.previous ? new Date(r.previous).getTime() : null;
  return { lapsed: previous !== null && r !== undefined && previous <= new Date(r.db_now).getTime() };
}

/** Ends `holder`'s lease now (a clean stop): runs it leaves behind are taken over at the next sweep. */
export async function expireLease(db: Q, holder: string): Promise<void> {
  await sql`UPDATE holder_leases SET expires_at = now() WHERE holder = ${holder} AND expires_at > now()`.execute(db);
}

/** Leases expired for a day: their holders are long gone (what they held was taken over). */
export async function dropOldLeases(db: Q): Promise<void> {
  await sql`DELETE FROM holder_leases WHERE expires_at < now() - interval '1 day'`.execute(db);
}

/** A running record not held by `worker`, with its holder's lease, read in one statement. */
export interface HeldElsewhere {
  id: string;
  claimed_by: string | null;
  heartbeat_at: Date | null;
  expires_at: Date | null;
  db_now: Date;
}

/** Running records held by any other process (no payloads), with their holders' leases. */
export async function heldElsewhere(db: Q, worker: string): Promise<HeldElsewhere[]> {
  const res = await sql<HeldElsewhere>`
    SELECT e.id, e.claimed_by, e.heartbeat_at, l.expires_at, now() AS db_now
    FROM executions e LEFT JOIN holder_leases l ON l.holder = e.claimed_by
    WHERE e.status = 'running' AND (e.claimed_by IS NULL OR e.claimed_by <> ${worker})`.execute(db);
  return res.rows.map((r) => ({ ...r, heartbeat_at: r.heartbeat_at ? new Date(r.heartbeat_at) : null, expires_at: r.expires_at ? new Date(r.expires_at) : null, db_now: new Date(r.db_now) }));
}

/**
 * Takes `ids` (running, held by `dead`) for `worker` if `dead`'s lease is still expired, under the
 * lease row's lock (see the module comment). Returns the records taken.
 */
export async function takeFromExpired(db: Db, dead: string, ids: string[], worker: string, now: Date): Promise<ExecutionRow[]> {
  if (ids.length === 0) return [];
  return db.kysely.transaction().execute(async (tx) => {
    const lease = await sql<{ holder: string }>`SELECT holder FROM holder_leases WHERE holder = ${dead} AND expires_at <= now() FOR UPDATE`.execute(tx);
    if (lease.rows.length === 0) return [];
    return tx
      .updateTable('executions')
      .set({ claimed_by: worker, heartbeat_at: now })
      .where('id', 'in', ids)
      .where('status', '=', 'running')
      .where('claimed_by', '=', dead)
      .returningAll()
      .execute();
  });
}

/** Of `holders`, those whose lease is live by the database's clock. */
export async function liveLeases(db: Q, holders: string[]): Promise<Set<string>> {
  if (holders.length === 0) return new Set();
  const res = await sql<{ holder: string }>`SELECT holder FROM holder_leases WHERE holder = ANY(${holders}::text[]) AND expires_at > now()`.execute(db);
  return new Set(res.rows.map((r) => r.holder));
}

/** Of `ids`, who holds each now and in which status (missing ids: no such record). */
export async function holdersOf(db: Q, ids: string[]): Promise<Map<string, { status: string; claimed_by: string | null }>> {
  if (ids.length === 0) return new Map();
  const rows = await db.selectFrom('executions').select(['id', 'status', 'claimed_by']).where('id', 'in', ids).execute();
  return new Map(rows.map((r) => [r.id, { status: r.status, claimed_by: r.claimed_by }]));
}
