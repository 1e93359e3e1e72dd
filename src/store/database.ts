/**
 * The database: one kysely `Database` interface over PostgreSQL (pg) or embedded PGlite.
 * `SVC_DATABASE_URL` set → PostgreSQL; unset → PGlite under the workspace.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { parseJson } from '../util/json.ts';
import { prepareMarkedStatements } from './prepared.ts';
import type { Database } from './tables.ts';

export * from './tables.ts';

/** The `json` type's OID: its columns are parsed with {@link parseJson}, numbers kept exactly. */
const JSON_OID = 114;


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
