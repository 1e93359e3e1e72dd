/** The dead letter queue (SPEC §2.9, §4.13). */
import { sql, type Kysely, type Transaction } from 'kysely';
import type { Database, DlqRow } from './database.ts';
import { canMatchText } from './executions.repository.ts';
import { stringifyJson } from '../util/json.ts';

type Q = Kysely<Database> | Transaction<Database>;

/** A new DLQ entry. */
export interface NewDlqEntry {
  jobId: string;
  jobData: { code: string; input_data: unknown; job_type: string; [k: string]: unknown };
  errorType: string;
  errorMessage: string;
  retryCount: number;
  clientIp: string | null;
  correlationId: string | null;
}

/** Adds an entry. */
export async function insertDlq(db: Q, e: NewDlqEntry): Promise<DlqRow> {
  return db
    .insertInto('dlq')
    .values({
      job_id: e.jobId,
      job_data: stringifyJson(e.jobData),
      error_type: e.errorType,
      error_message: e.errorMessage,
      retry_count: e.retryCount,
      client_ip: e.clientIp,
      correlation_id: e.correlationId,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
}

/** Newest first, optionally by error type; one extra row tells whether more exist. */
export async function listDlq(db: Q, f: { errorType?: string | undefined; limit: number; offset: number }): Promise<{ rows: DlqRow[]; hasMore: boolean }> {
  if (f.errorType && !canMatchText(f.errorType)) return { rows: [], hasMore: false };
  let q = db.selectFrom('dlq').selectAll();
  if (f.errorType) q = q.where('error_type', '=', f.errorType);
  const rows = await q.orderBy('id', 'desc').limit(f.limit + 1).offset(f.offset).execute();
  return { rows: rows.slice(0, f.limit), hasMore: rows.length > f.limit };
}

/** Total and per-type counts. */
export async function dlqStats(db: Q): Promise<{ total: number; by_error_type: Record<string, number> }> {
  const r = await sql<{ error_type: string; n: number }>`SELECT error_type, count(*)::int AS n FROM dlq GROUP BY error_type`.execute(db);
  const by: Record<string, number> = {};
  let total = 0;
  for (const row of r.rows) {
    by[row.error_type] = row.n;
    total += row.n;
  }
  return { total, by_error_type: by };
}

/** Deletes an entry; false when there was none. */
export async function deleteDlq(db: Q, id: number): Promise<boolean> {
  const r = await db.deleteFrom('dlq').where('id', '=', id).executeTakeFirst();
  return Number(r.numDeletedRows) > 0;
}
