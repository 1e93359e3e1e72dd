/**
 * The database: one kysely `Database` interface over PostgreSQL (pg) or embedded PGlite.
 * `SVC_DATABASE_URL` set → PostgreSQL; unset → PGlite under the workspace.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { Kysely, PostgresDialect, type ColumnType, type Generated, type Insertable, type Selectable, type Updateable } from 'kysely';
import pg from 'pg';
import { parseJson } from '../util/json.ts';
import { prepareMarkedStatements } from './prepared.ts';

/** The `json` type's OID: its columns are parsed with {@link parseJson}, numbers kept exactly. */
const JSON_OID = 114;

type Timestamp = ColumnType<Date, Date | string, Date | string>;
type GeneratedTimestamp = ColumnType<Date, Date | string | undefined, Date | string>;
type Json<T = unknown> = ColumnType<T, string, string>;

/** Execution records (SPEC §2.3, every field including the extended view) and the durable queue. */
export interface ExecutionsTable {
  id: string;
  status: string;
  /** `sync` (POST /execute) or `async` (the queue). */
  mode: string;
  job_type: string;
  job_version: string;
  job_ref: string;
  code: string;
  input_data: Json;
  code_hash: string;
  input_hash: string;
  timeout_s: number;
  startup_timeout_s: number;
  requirements: Json<string[]>;
  idempotency_key: string | null;
  /** sha256 of the canonical submission payload, compared on idempotent re-submission. */
  payload_hash: string | null;
  parent_execution_id: string | null;
  relationship: string | null;
  created_at: GeneratedTimestamp;
  started_at: Timestamp | null;
  ended_at: Timestamp | null;
  duration_ms: number | null;
  exit_code: number | null;
  /** A JSON string (the `json` type keeps NUL as `\u0000`; `text` cannot hold it). */
  stdout: Json<string> | null;
  stderr: Json<string> | null;
  stdout_truncated: Generated<boolean>;
  stderr_truncated: Generated<boolean>;
  /** Entries the program left in `/output` (listed or not); null for records from before it was counted. */
  artifacts_total: number | null;
  /** `/output` held more entries than the record lists. */
  artifacts_truncated: Generated<boolean>;
  output: Json | null;
  error: Json | null;
  timing: Json | null;
  resource_usage: Json | null;
  /** Phase the run reached: `startup` until user code began, then `execution`. */
  phase: string | null;
  /** Worker (process) holding the run, for crash recovery. */
  claimed_by: string | null;
  heartbeat_at: Timestamp | null;
  cancel_requested: Generated<boolean>;
  attempts: Generated<number>;
  /** A queued job given back after an infrastructure fault is not claimed before this time. */
  run_after: Timestamp | null;
  /** Infrastructure failures of this job before its code started (each one gave it back to the queue). */
  infra_failures: Generated<number>;
  /** Ended `failed` by an infrastructure error before its code started: its idempotency key may be reused. */
  failed_before_start: Generated<boolean>;
  /** The key of a job whose key was taken over by a resubmission (see `failed_before_start`). */
  retired_idempotency_key: string | null;
  /** How many files the run gets under `/input/files/` (artifacts of kind `input`). */
  input_files: Generated<number>;
  /** A session's cell (issue 19): its session and its number there (1, 2, …); `relationship` is `session`. */
  session_id: string | null;
  cell: number | null;
  client_ip: string | null;
  correlation_id: string | null;
  /** W3C traceparent the run's trace continues (migration 0008); null without a trace. */
  traceparent: string | null;
  /** The trace id of `traceparent`, for the record and the logs. */
  trace_id: string | null;
  /** Where the record is POSTed when it ends (issue 21); null: nowhere. */
  callback_url: string | null;
}

/** Artifact metadata and bytes (SPEC §2.5); `kind` is `output` or `input`. */
export interface ArtifactsTable {
  execution_id: string;
  kind: string;
  name: string;
  size_bytes: number;
  sha256: string;
  content_type: string;
  /** Null when the file was not kept (`skipped` says why). */
  data: Buffer | null;
  skipped: string | null;
  /** An input file taken from an earlier job's artifact (`input_artifacts`): that job and name. */
  source_execution_id: Generated<string | null>;
  source_name: Generated<string | null>;
  created_at: GeneratedTimestamp;
}

/** The dead letter queue (SPEC §2.9). */
export interface DlqTable {
  id: Generated<number>;
  job_id: string;
  job_data: Json;
  error_type: string;
  error_message: string;
  retry_count: number;
  created_at: GeneratedTimestamp;
  client_ip: string | null;
  correlation_id: string | null;
}

/** Job-type builds (SPEC §4.9): the lease of a running build and the record of a finished one. */
export interface JobTypeBuildsTable {
  id: string;
  job_type: string;
  input_key: string;
  /** `building`, `built` or `failed`. */
  status: string;
  version_tag: string | null;
  requirements: Json<string[]>;
  python_version: string;
  /** Progress: `queued`, `resolving`, `installing`, `publishing`, `built`, `failed`. */
  phase: string;
  digest: string | null;
  image_ref: string | null;
  lock: Json<{ name: string; version: string; sha256: string | null }[]> | null;
  error: string | null;
  owner: string;
  heartbeat_at: Timestamp;
  created_at: Timestamp;
  finished_at: Timestamp | null;
  duration_ms: number | null;
}

/** Run events (`GET /jobs/{id}/events`): phase changes and output chunks, per run in `id` order. */
export interface ExecutionEventsTable {
  id: Generated<number>;
  execution_id: string;
  /** The SSE event name: `status`, `stdout`, `stderr`, `truncated`. */
  kind: string;
  /** The event's data, a JSON text. */
  data: Json;
  created_at: GeneratedTimestamp;
}

/** The webhook outbox (migration 0007): one row per ended record with a callback. */
export interface WebhookDeliveriesTable {
  id: string;
  execution_id: string;
  url: string;
  status: Generated<string>;
  attempts: Generated<number>;
  next_attempt_at: Timestamp | null;
  first_attempt_at: Timestamp | null;
  lease_until: Timestamp | null;
  claimed_by: string | null;
  last_status_code: number | null;
  last_error: string | null;
  created_at: GeneratedTimestamp;
  ended_at: Timestamp | null;
}

/** One delivery attempt (`GET /jobs/{id}/deliveries`). */
export interface WebhookAttemptsTable {
  id: Generated<number>;
  delivery_id: string;
  attempt: number;
  started_at: Timestamp;
  duration_ms: number;
  status_code: number | null;
  error: string | null;
  outcome: string;
}

/** Sessions (issue 19): one row per session; its cells are execution records. */
export interface SessionsTable {
  id: string;
  /** `starting`, `ready`, `busy`, `ended`. */
  status: string;
  /** `closed`, `idle`, `lifetime`, `oom`, `crashed`, `service_restart`; null while live. */
  end_reason: string | null;
  job_type: string;
  idle_timeout_s: number;
  max_lifetime_s: number;
  cell_timeout_s: number;
  cells: Generated<number>;
  running_cell_id: string | null;
  /** The process whose sandbox it is (`Executions.workerId`) and its last sign of life. */
  owner: string;
  heartbeat_at: Timestamp;
  created_at: GeneratedTimestamp;
  last_used_at: Timestamp;
  ended_at: Timestamp | null;
  client_ip: string | null;
  correlation_id: string | null;
}

/** All tables. */
export interface Database {
  sessions: SessionsTable;
  executions: ExecutionsTable;
  artifacts: ArtifactsTable;
  dlq: DlqTable;
  job_type_builds: JobTypeBuildsTable;
  execution_events: ExecutionEventsTable;
  webhook_deliveries: WebhookDeliveriesTable;
  webhook_attempts: WebhookAttemptsTable;
}

export type ExecutionRow = Selectable<ExecutionsTable>;
export type NewExecutionRow = Insertable<ExecutionsTable>;
export type ExecutionUpdate = Updateable<ExecutionsTable>;
export type ArtifactRow = Selectable<ArtifactsTable>;
export type DlqRow = Selectable<DlqTable>;
export type SessionRow = Selectable<SessionsTable>;
export type JobTypeBuildRow = Selectable<JobTypeBuildsTable>;

/** A database handle plus what the queue needs to wake up across processes. */
export interface Db {
  kysely: Kysely<Database>;
  /** `postgres` or `pglite`. */
  kind: 'postgres' | 'pglite';
  /** Subscribe to a NOTIFY channel; returns an unsubscribe function. */
  listen(channel: string, onPayload: (payload: string) => void): Promise<() => Promise<void>>;
  /** Send a NOTIFY. */
  notify(channel: string, payload: string): Promise<void>;
  destroy(): Promise<void>;
}

// pg returns int8 and numeric as strings by default; our counts fit in a double.
pg.types.setTypeParser(20, (v) => Number(v));
// `json` columns hold the exact text we wrote (migration 0002); read numbers back exactly too.
pg.types.setTypeParser(JSON_OID, parseJson);

/** Opens PostgreSQL when `url` is given, PGlite under `workspace` otherwise. */
export async function createDb(opts: { url: string | null; workspace: string; poolSize?: number; preparedStatements?: boolean }): Promise<Db> {
  if (opts.url) return createPostgres(opts.url, opts.poolSize ?? 10, opts.preparedStatements ?? true);
  const dir = path.join(opts.workspace, 'pglite');
  mkdirSync(dir, { recursive: true });
  return createPglite(dir);
}

/** The database could not be reached at start; the message names the URL (no password) and the cause. */
export class DatabaseConnectError extends Error {
  override readonly name = 'DatabaseConnectError';
  constructor(url: string, cause: unknown) {
    const why = cause instanceof AggregateError ? cause.errors.map((e: unknown) => (e instanceof Error ? e.message : String(e))).join('; ') : cause instanceof Error ? cause.message : String(cause);
    super(`cannot connect to the database at ${redactUrl(url)}: ${why || (cause as { code?: string })?.code || 'unknown error'}`, { cause });
  }
}

/** `url` with its password replaced by `***` (for messages and logs). */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(an unparsable database URL)';
  }
}

async function createPostgres(url: string, max: number, preparedStatements: boolean): Promise<Db> {
  // Fail at start, plainly, rather than on the first request: one probe connection with a bound wait.
  const probe = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 });
  probe.on('error', () => {});
  try {
    await probe.connect();
    await probe.query('SELECT 1');
  } catch (err) {
    throw new DatabaseConnectError(url, err);
  } finally {
    await probe.end().catch(() => {});
  }
  const pool = new pg.Pool({ connectionString: url, max });
  // An idle client that errors (server restart) must not crash the process.
  pool.on('error', () => {});
  // Nor one checked out between two statements (pg.Pool listens only on idle ones): the statement
  // in flight, or the next one, fails on its own and the pool drops the client when it comes back.
  pool.on('connect', (client) => client.on('error', () => {}));
  if (preparedStatements) prepareMarkedStatements(pool);
  const kysely = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  const handlers = new Map<string, Set<(p: string) => void>>();
  // One LISTEN connection. When it drops (server restart, terminated backend) it reconnects by itself
  // and re-issues LISTEN for every channel: notifications sent meanwhile are lost, which every
  // subscriber tolerates (channels.ts), but none after the server is back may be.
  let listener: Promise<pg.Client> | null = null;
  /** The client `listener` resolved to, while it is usable. */
  let connected: pg.Client | null = null;
  let closed = false;
  let retryTimer: NodeJS.Timeout | null = null;
  const connectListener = async (): Promise<pg.Client> => {
    const c = new pg.Client({ connectionString: url });
    let dropped = false;
    const drop = () => {
      if (dropped) return;
      dropped = true;
      if (connected === c) {
        connected = null;
        listener = null;
      }
      c.end().catch(() => {});
      scheduleRelisten(250);
    };
    c.on('error', drop);
    c.on('end', drop);
    c.on('notification', (msg) => {
      for (const h of handlers.get(msg.channel) ?? []) h(msg.payload ?? '');
    });
    try {
      await c.connect();
      for (const ch of handlers.keys()) await c.query(`LISTEN ${quoteIdent(ch)}`);
      connected = c;
    } catch (err) {
      dropped = true;
      c.end().catch(() => {});
      throw err;
    }
    return c;
  };
  const ensureListener = (): Promise<pg.Client> => {
    if (!listener) {
      const p = connectListener();
      listener = p;
      p.catch(() => {
        if (listener === p) listener = null;
      });
    }
    return listener;
  };
  const scheduleRelisten = (delayMs: number) => {
    if (closed || retryTimer || handlers.size === 0) return;
    retryTimer = setTimeout(() => {
      retryTimer = null;
      ensureListener().catch(() => scheduleRelisten(Math.min(delayMs * 2, 5000)));
    }, delayMs);
    retryTimer.unref();
  };
  return {
    kysely,
    kind: 'postgres',
    async listen(channel, onPayload) {
      let set = handlers.get(channel);
      const first = !set;
      if (!set) handlers.set(channel, (set = new Set()));
      set.add(onPayload);
      const c = await ensureListener();
      // A fresh connection already listened to every channel in `handlers`; LISTEN twice is harmless.
      if (first) await c.query(`LISTEN ${quoteIdent(channel)}`);
      return async () => {
        set.delete(onPayload);
        if (set.size === 0) {
          handlers.delete(channel);
          const l = await listener?.catch(() => null);
          await l?.query(`UNLISTEN ${quoteIdent(channel)}`).catch(() => {});
        }
      };
    },
    async notify(channel, payload) {
      await pool.query('SELECT pg_notify($1, $2)', [channel, payload]);
    },
    async destroy() {
      closed = true;
      if (retryTimer) clearTimeout(retryTimer);
      const l = await listener?.catch(() => null);
      await l?.end().catch(() => {});
      await kysely.destroy();
    },
  };
}

/** SQLSTATEs of a server that is going away or not accepting connections yet (classes 08, 57P). */
const UNAVAILABLE_SQLSTATE = /^(08...|57P0[1-4])$/;
const UNAVAILABLE_ERRNO = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN']);

/**
 * True when `err` says the database cannot be reached right now (refused, dropped, restarting,
 * backend terminated) rather than that a statement was wrong: callers answer 503 or retry the write.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && (UNAVAILABLE_SQLSTATE.test(code) || UNAVAILABLE_ERRNO.has(code))) return true;
    // pg's own messages for a connection that ended or never became usable carry no code.
    if (/^Connection terminated|not queryable|Client was closed|timeout exceeded when trying to connect/i.test(e.message)) return true;
    if (e instanceof AggregateError && e.errors.some((x) => isDatabaseUnavailable(x))) return true;
  }
  return false;
}

async function createPglite(dir: string): Promise<Db> {
  const { PGlite } = await import('@electric-sql/pglite');
  const { PGliteDialect } = await import('./pglite-dialect.ts');
  const client = await PGlite.create(dir, { parsers: { [JSON_OID]: parseJson } });
  const kysely = new Kysely<Database>({ dialect: new PGliteDialect(client) });
  return {
    kysely,
    kind: 'pglite',
    async listen(channel, onPayload) {
      const unsub = await client.listen(channel, onPayload);
      return async () => {
        await unsub();
      };
    },
    async notify(channel, payload) {
      await client.query('SELECT pg_notify($1, $2)', [channel, payload]);
    },
    async destroy() {
      await kysely.destroy();
      if (!client.closed) await client.close();
    },
  };
}

function quoteIdent(s: string): string {
  return `"${s.replaceAll('"', '""')}"`;
}
