/**
 * Execution records: inserts, reads, guarded updates, the history list and the queue's depth counts.
 * Plain functions taking a kysely handle (or a transaction) first; callers own transactions. Claims
 * and heartbeats on the same table are the queue's (`src/queue/`).
 */
import { sql, type Kysely, type Transaction } from 'kysely';
import { TERMINAL_STATUSES, type RecordStatus } from '../executions/status.ts';
import type { Database, ExecutionRow, ExecutionsTable, ExecutionUpdate, NewExecutionRow } from './database.ts';
import { prepared } from './prepared.ts';

/** A kysely handle or a transaction: what every repository function takes first. */
export type Q = Kysely<Database> | Transaction<Database>;

/**
 * Inserts a record. With `flushLater` its commit does not wait for the write-ahead log to reach the
 * disk (`synchronous_commit` off for this statement's own transaction, set from inside it, so it
 * needs no round trip of its own; never pass a transaction then, it would apply to all of it). For a
 * sync run's record only: the run's verdict is written with a synchronous commit before the client
 * gets any answer, and PostgreSQL flushes its log in order, so that commit makes this one durable
 * too. What is given up: if PostgreSQL itself crashes during the run (a restart flushes the log), the
 * record can be lost, and the request fails instead of answering. The record is visible to every
 * session at once either way, so crash recovery of the service is unchanged.
 */
export async function insertExecution(db: Q, row: NewExecutionRow, o: { flushLater?: boolean } = {}): Promise<ExecutionRow> {
  const q = db.insertInto('executions').values(row).returningAll();
  if (!o.flushLater) return q.executeTakeFirstOrThrow();
  // A sync run's insert is on its critical path: prepared (see prepared.ts).
  const r = await db.executeQuery(prepared(q.returning(sql<string>`set_config('synchronous_commit', 'off', true)`.as('unflushed')).compile()));
  const first = r.rows[0];
  if (!first) throw new Error('insert returned no row');
  const { unflushed: _, ...inserted } = first;
  return inserted as ExecutionRow;
}

/** Column types of `executions` that are not `text` (for the array casts of {@link insertExecutions}). */
export const EXECUTION_COLUMN_TYPES: Partial<Record<keyof ExecutionsTable, string>> = {
  input_data: 'json',
  requirements: 'json',
  output: 'json',
  error: 'json',
  timing: 'json',
  resource_usage: 'json',
  timeout_s: 'integer',
  startup_timeout_s: 'integer',
  duration_ms: 'integer',
  exit_code: 'integer',
  attempts: 'integer',
  run_after: 'timestamptz',
  infra_failures: 'integer',
  input_files: 'integer',
  cell: 'integer',
  failed_before_start: 'boolean',
  artifacts_total: 'integer',
  artifacts_truncated: 'boolean',
  created_at: 'timestamptz',
  started_at: 'timestamptz',
  ended_at: 'timestamptz',
  heartbeat_at: 'timestamptz',
  stdout: 'json',
  stderr: 'json',
  stdout_truncated: 'boolean',
  stderr_truncated: 'boolean',
  cancel_requested: 'boolean',
};

/**
 * Inserts several records in one statement, one array parameter per column through `unnest`: the
 * statement's text and parameter count stay the same whatever the batch size, and nothing is read
 * back. A column one row sets and another leaves out is null in the other (not its default; rows from
 * `buildRow` all set the same columns). With `notify`, the same statement signals that channel
 * (PostgreSQL delivers one notification per transaction for identical payloads), which saves the
 * queue a round trip per batch.
 */
export async function insertExecutions(db: Q, rows: NewExecutionRow[], notify?: string): Promise<void> {
  if (rows.length === 0) return;
  const columns = [...new Set(rows.flatMap((r) => Object.keys(r)))] as (keyof NewExecutionRow & keyof ExecutionsTable)[];
  const arrays = columns.map((c) => sql`${rows.map((r) => r[c] ?? null)}::${sql.raw(EXECUTION_COLUMN_TYPES[c] ?? 'text')}[]`);
  const inserted = await sql<unknown>`
    INSERT INTO executions (${sql.join(columns.map((c) => sql.ref(c)))})
    SELECT * FROM unnest(${sql.join(arrays)})
    RETURNING ${notify ? sql`pg_notify(${notify}, '')` : sql`NULL`}`.execute(db);
  if (inserted.rows.length !== rows.length) throw new Error(`inserted ${inserted.rows.length} of ${rows.length} executions`);
}

/**
 * Inserts a record unless its idempotency key exists; returns the inserted or the existing row.
 * One statement, so concurrent submissions with one key create one job.
 */
export async function insertIdempotent(db: Q, row: NewExecutionRow): Promise<{ row: ExecutionRow; created: boolean }> {
  const inserted = await db
    .insertInto('executions')
    .values(row)
    .onConflict((oc) => oc.column('idempotency_key').where('idempotency_key', 'is not', null).doNothing())
    .returningAll()
    .executeTakeFirst();
  if (inserted) return { row: inserted, created: true };
  const existing = await db
    .selectFrom('executions')
    .selectAll()
    .where('idempotency_key', '=', row.idempotency_key ?? '')
    .executeTakeFirstOrThrow();
  return { row: existing, created: false };
}

/**
 * True when `s` can equal a stored `text` value. PostgreSQL text cannot hold NUL (a parameter with
 * one is an error, not a non-match), so a key with NUL names no row and is answered without a query.
 */
export function canMatchText(s: string): boolean {
  return !s.includes('\u0000');
}

/** One record by id. */
export async function getExecution(db: Q, id: string): Promise<ExecutionRow | undefined> {
  if (!canMatchText(id)) return undefined;
  return db.selectFrom('executions').selectAll().where('id', '=', id).executeTakeFirst();
}

/**
 * Updates a record only while it has one of `fromStatuses` (and, when given, is held by `claimedBy`):
 * the guard that makes finalization happen once even with several processes. Returns the new row, or
 * undefined when the guard did not match.
 */
export async function updateExecutionIf(
  db: Q,
  id: string,
  fromStatuses: readonly RecordStatus[],
  patch: ExecutionUpdate,
  claimedBy?: string,
): Promise<ExecutionRow | undefined> {
  let q = db.updateTable('executions').set(patch).where('id', '=', id).where('status', 'in', [...fromStatuses]);
  if (claimedBy !== undefined) q = q.where('claimed_by', '=', claimedBy);
  return q.returningAll().executeTakeFirst();
}

/**
 * Settles a running record held by `claimedBy` and sends `NOTIFY channel, id` in the same statement
 * (delivered on commit, so a waiter never sees the notification before the row), with the run's last
 * `events` stored (and `NOTIFY events.channel, id`) in it too. One round trip.
 */
export async function settleRunning(
  db: Q,
  id: string,
  claimedBy: string,
  patch: ExecutionUpdate,
  channel: string,
  events?: { list: readonly { kind: string; data: string }[]; channel: string },
): Promise<ExecutionRow | undefined> {
  const list = events?.list ?? [];
  // The run's last events go in with the verdict, atomically and in one round trip: a reader that
  // sees the record terminal has them, and none is stored for a record someone else settled.
  const query = db
    .with('u', (q) => q.updateTable('executions').set(patch).where('id', '=', id).where('status', '=', 'running').where('claimed_by', '=', claimedBy).returningAll())
    .with('ev', (q) =>
      q
        .insertInto('execution_events')
        .columns(['execution_id', 'kind', 'data'])
        .expression(
          sql`SELECT u.id, x.kind, x.data::json FROM u, unnest(${list.map((e) => e.kind)}::text[], ${list.map((e) => e.data)}::text[]) WITH ORDINALITY AS x(kind, data, ord) ORDER BY x.ord`,
        ),
    )
    .selectFrom('u')
    .selectAll()
    .select(sql<string>`pg_notify(${channel}, u.id)`.as('notified'))
    .select(sql<string | null>`CASE WHEN ${list.length} > 0 THEN pg_notify(${events?.channel ?? ''}, u.id) END`.as('events_notified'));
  // Every run's verdict: prepared (see prepared.ts).
  const row = (await db.executeQuery(prepared(query.compile()))).rows[0];
  if (!row) return undefined;
  const { notified: _notified, events_notified: _events, ...rest } = row;
  return rest as ExecutionRow;
}

/** Filters of the history list. */
export interface ListFilter {
  status?: string | undefined;
  jobType?: string | undefined;
  limit: number;
  offset: number;
}

/** The columns of a record's standard view (SPEC §2.3 without `view=full`): what a history page reads. */
export const BRIEF_COLUMNS = ['id', 'status', 'job_type', 'job_version', 'created_at', 'started_at', 'ended_at', 'duration_ms', 'exit_code', 'stdout', 'stderr', 'output', 'error', 'timing'] as const;

/** A record as a history page without `view=full` reads it. */
export type BriefRow = Pick<ExecutionRow, (typeof BRIEF_COLUMNS)[number]>;

function listQuery(db: Q, f: ListFilter) {
  let q = db.selectFrom('executions');
  if (f.status) q = q.where('status', '=', f.status);
  if (f.jobType) q = q.where('job_type', '=', f.jobType);
  return q.orderBy('created_at', 'desc').orderBy('id', 'desc').limit(f.limit + 1).offset(f.offset);
}

/** Newest first; fetches one row more than `limit` to tell whether more exist. */
export async function listExecutions(db: Q, f: ListFilter): Promise<{ rows: ExecutionRow[]; hasMore: boolean }> {
  if (f.jobType && !canMatchText(f.jobType)) return { rows: [], hasMore: false };
  const rows = await listQuery(db, f).selectAll().execute();
  return { rows: rows.slice(0, f.limit), hasMore: rows.length > f.limit };
}

/**
 * {@link listExecutions} reading only {@link BRIEF_COLUMNS}: a page of 100 records is parsed in the
 * service's event loop, which the runs it drives share, and the code, input and settings it would
 * otherwise parse too are most of a row.
 */
export async function listBrief(db: Q, f: ListFilter): Promise<{ rows: BriefRow[]; hasMore: boolean }> {
  if (f.jobType && !canMatchText(f.jobType)) return { rows: [], hasMore: false };
  const rows = await listQuery(db, f).select([...BRIEF_COLUMNS]).execute();
  return { rows: rows.slice(0, f.limit), hasMore: rows.length > f.limit };
}

/** Counts of queued and running records (the queue's depth). */
export async function queueCounts(db: Q): Promise<{ queued: number; running: number }> {
  const r = await sql<{ queued: number; running: number }>`
    SELECT (SELECT count(*) FROM executions WHERE status = 'queued')::int AS queued,
           (SELECT count(*) FROM executions WHERE status = 'running')::int AS running`.execute(db);
  return r.rows[0] ?? { queued: 0, running: 0 };
}

/**
 * Jobs queued or running, counted up to `cap` (the bound is all admission needs, and it keeps the
 * count cheap however deep the queue is).
 */
export async function activeCountUpTo(db: Q, cap: number): Promise<number> {
  const r = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM (
      SELECT 1 FROM executions WHERE status = 'queued'
      UNION ALL
      SELECT 1 FROM executions WHERE status = 'running'
      LIMIT ${cap}
    ) t`.execute(db);
  return r.rows[0]?.n ?? 0;
}

/** Position (1-based) of a queued record among queued records, oldest first. */
export async function queuePosition(db: Q, id: string): Promise<number | null> {
  const r = await sql<{ pos: number }>`
    SELECT count(*)::int AS pos FROM executions q, executions me
    WHERE me.id = ${id} AND me.status = 'queued' AND q.status = 'queued'
      AND (q.created_at, q.id) <= (me.created_at, me.id)`.execute(db);
  const pos = r.rows[0]?.pos ?? 0;
  return pos > 0 ? pos : null;
}

/** Of `ids`, those with a non-terminal record. */
export async function liveIds(db: Q, ids: string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await db.selectFrom('executions').select('id').where('id', 'in', ids).where('status', 'not in', [...TERMINAL_STATUSES]).execute();
  return new Set(rows.map((r) => r.id));
}
