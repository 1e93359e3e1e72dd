/**
 * The database: one kysely `Database` interface over PostgreSQL (pg) or embedded PGlite.
 * `SVC_DATABASE_URL` set → PostgreSQL; unset → PGlite under the workspace.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { Kysely, PostgresDialect, type ColumnType, type Generated, type Insertable, type Selectable, type Updateable } from 'kysely';
import pg from 'pg';

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
  client_ip: string | null;
  correlation_id: string | null;
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

/** All tables. */
export interface Database {
  executions: ExecutionsTable;
  artifacts: ArtifactsTable;
  dlq: DlqTable;
}

export type ExecutionRow = Selectable<ExecutionsTable>;
export type NewExecutionRow = Insertable<ExecutionsTable>;
export type ExecutionUpdate = Updateable<ExecutionsTable>;
export type ArtifactRow = Selectable<ArtifactsTable>;
export type DlqRow = Selectable<DlqTable>;

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

/** Opens PostgreSQL when `url` is given, PGlite under `workspace` otherwise. */
export async function createDb(opts: { url: string | null; workspace: string; poolSize?: number }): Promise<Db> {
  if (opts.url) return createPostgres(opts.url, opts.poolSize ?? 10);
  const dir = path.join(opts.workspace, 'pglite');
  mkdirSync(dir, { recursive: true });
  return createPglite(dir);
}

async function createPostgres(url: string, max: number): Promise<Db> {
  const pool = new pg.Pool({ connectionString: url, max });
  // An idle client that errors (server restart) must not crash the process.
  pool.on('error', () => {});
  const kysely = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  let listener: pg.Client | null = null;
  const handlers = new Map<string, Set<(p: string) => void>>();
  const ensureListener = async (): Promise<pg.Client> => {
    if (listener) return listener;
    const c = new pg.Client({ connectionString: url });
    c.on('error', () => {
      listener = null;
    });
    await c.connect();
    c.on('notification', (msg) => {
      for (const h of handlers.get(msg.channel) ?? []) h(msg.payload ?? '');
    });
    listener = c;
    for (const ch of handlers.keys()) await c.query(`LISTEN ${quoteIdent(ch)}`);
    return c;
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
      if (first) await c.query(`LISTEN ${quoteIdent(channel)}`);
      return async () => {
        set.delete(onPayload);
        if (set.size === 0) {
          handlers.delete(channel);
          await listener?.query(`UNLISTEN ${quoteIdent(channel)}`).catch(() => {});
        }
      };
    },
    async notify(channel, payload) {
      await pool.query('SELECT pg_notify($1, $2)', [channel, payload]);
    },
    async destroy() {
      await listener?.end().catch(() => {});
      await kysely.destroy();
    },
  };
}

async function createPglite(dir: string): Promise<Db> {
  const { PGlite } = await import('@electric-sql/pglite');
  const { PGliteDialect } = await import('./pglite-dialect.ts');
  const client = await PGlite.create(dir);
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
