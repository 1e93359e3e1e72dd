/**
 * Prepared statements for the few statements on a run's critical path (a sync run's insert and its
 * verdict). PostgreSQL parses and plans a statement sent without a name every time: for the
 * verdict's statement (an update, an insert of events and two notifies in one) that was about a
 * third of a millisecond of the server's time per run, measured with log_min_duration_statement.
 * Named, it is parsed once per connection and its plan is reused.
 *
 * Why our own: kysely has no way to name a statement, and node-postgres prepares one only when the
 * query it is given carries a `name`. So a repository marks a compiled query as prepared
 * ({@link prepared}: its SQL text gets a stable name), and {@link prepareMarkedStatements} makes the
 * pool's clients send marked texts with that name. Only a bounded number of texts is ever marked
 * (the callers' texts are fixed by their columns), so no connection accumulates statements. PGlite
 * runs in the process and ignores the marks.
 *
 * Off (`database_prepared_statements: false`) for a connection pooler in transaction mode that does
 * not carry prepared statements across server connections (PgBouncer before 1.21).
 */
import { createHash } from 'node:crypto';
import type { CompiledQuery } from 'kysely';
import type pg from 'pg';

/** SQL text → statement name. */
const names = new Map<string, string>();
/** Most texts ever marked; later ones run unnamed. */
const MAX_MARKED = 32;

/** Marks a compiled query to be sent as a prepared statement (where the pool prepares them); returns it. */
export function prepared<R>(q: CompiledQuery<R>): CompiledQuery<R> {
  if (!names.has(q.sql) && names.size < MAX_MARKED) names.set(q.sql, `sandpod_${createHash('sha256').update(q.sql).digest('hex').slice(0, 24)}`);
  return q;
}

/** The statement name of a marked SQL text. */
export function statementName(sql: string): string | undefined {
  return names.get(sql);
}

type QueryFn = (...args: unknown[]) => unknown;

/** Makes every client of `pool` send marked texts as named statements (`client.query(text, values)` calls). */
export function prepareMarkedStatements(pool: pg.Pool): void {
  pool.on('connect', (client) => {
    const query = client.query.bind(client) as QueryFn;
    (client as unknown as { query: QueryFn }).query = (text: unknown, values?: unknown, callback?: unknown) => {
      const name = typeof text === 'string' ? names.get(text) : undefined;
      return name === undefined ? query(text, values, callback) : query({ name, text, values }, callback);
    };
  });
}
