/** Run events (`GET /jobs/{id}/events`): appended by the run's holder, read after an event id. */
import { sql, type Kysely, type Transaction } from 'kysely';
import type { Database } from './database.ts';

type Q = Kysely<Database> | Transaction<Database>;

/** A new event: its SSE name and its data as JSON text. */
export interface NewRunEvent {
  kind: string;
  data: string;
}

/** A stored event. */
export interface StoredRunEvent {
  id: number;
  kind: string;
  /** The data's JSON text, as written. */
  data: string;
}

/** Appends events of one run in order (one statement; ids increase in list order). */
export async function appendEvents(db: Q, executionId: string, list: NewRunEvent[]): Promise<void> {
  if (list.length === 0) return;
  await db
    .insertInto('execution_events')
    .values(list.map((e) => ({ execution_id: executionId, kind: e.kind, data: e.data })))
    .execute();
}

/** Up to `limit` events of a run with an id above `afterId`, in id order. */
export async function eventsAfter(db: Q, executionId: string, afterId: number, limit: number): Promise<StoredRunEvent[]> {
  const rows = await db
    .selectFrom('execution_events')
    .select(['id', 'kind', sql<string>`data::text`.as('data')])
    .where('execution_id', '=', executionId)
    .where('id', '>', afterId)
    .orderBy('id')
    .limit(limit)
    .execute();
  return rows.map((r) => ({ id: Number(r.id), kind: r.kind, data: r.data }));
}

/** The highest event id of a run (0 when none) and whether any output event was stored. */
export async function eventsSummary(db: Q, executionId: string): Promise<{ maxId: number; hasOutput: boolean }> {
  const r = await db
    .selectFrom('execution_events')
    .select([
      sql<number | null>`max(id)`.as('max_id'),
      sql<boolean | null>`bool_or(kind IN ('stdout', 'stderr', 'truncated'))`.as('has_output'),
    ])
    .where('execution_id', '=', executionId)
    .executeTakeFirst();
  return { maxId: Number(r?.max_id ?? 0), hasOutput: r?.has_output === true };
}

/** The output a run's events hold so far, per stream, and the streams marked cut (for a writer that resumes). */
export async function storedOutput(db: Q, executionId: string): Promise<{ texts: Record<'stdout' | 'stderr', string[]>; truncated: ('stdout' | 'stderr')[] }> {
  const rows = await db
    .selectFrom('execution_events')
    .select(['kind', sql<string>`data::text`.as('data')])
    .where('execution_id', '=', executionId)
    .where('kind', 'in', ['stdout', 'stderr', 'truncated'])
    .orderBy('id')
    .execute();
  const texts: Record<'stdout' | 'stderr', string[]> = { stdout: [], stderr: [] };
  const truncated: ('stdout' | 'stderr')[] = [];
  for (const r of rows) {
    const d = JSON.parse(r.data) as { data?: unknown; stream?: unknown };
    if ((r.kind === 'stdout' || r.kind === 'stderr') && typeof d.data === 'string') texts[r.kind].push(d.data);
    if (r.kind === 'truncated' && (d.stream === 'stdout' || d.stream === 'stderr')) truncated.push(d.stream);
  }
  return { texts, truncated };
}
