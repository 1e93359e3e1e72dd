/**
 * The read model the HTTP layer uses: records, artifacts, the queue's depth, the dead letter queue and
 * a database ping, answered as wire-ready view objects. The API holds no SQL and does not know the
 * store; everything it reads goes through here. Reads the store's repositories already offer are
 * reused; the two it lacks (per-type queue stats, a ping) are written here with kysely.
 */
import { sql } from 'kysely';
import { systemClock, type Clock } from '../clock.ts';
import { getArtifact, listArtifacts, listArtifactsFor } from '../store/artifacts.repository.ts';
import type { Db, DlqRow, ExecutionRow } from '../store/database.ts';
import { deleteDlq, dlqStats, listDlq } from '../store/dlq.repository.ts';
import { getExecution, listBrief, listExecutions, queueCounts, queuePosition } from '../store/executions.repository.ts';
import { recordStatusOf, type RecordStatus, type STATUS_FILTERS } from './status.ts';
import { briefView, inputArtifactFiles, recordView } from './views.ts';
import { listDeliveries } from '../webhooks/outbox.ts';

/** A record as stored; opaque to the API, which hands it back to {@link History.recordOf}. */
export type StoredRecord = ExecutionRow;

/** SPEC §4.3 brief job status. */
export interface JobStatusView {
  job_id: string;
  status: RecordStatus;
  job_type: string;
  created_at: string;
  started_at: string | null;
  ended_at: string | null;
}

/** One downloadable artifact: bytes (null when not asked for) and the headers' facts. */
export interface ArtifactFile {
  data: Buffer | null;
  sha256: string;
  contentType: string;
  size: number;
}

/** SPEC §2.9 dead letter queue entry. */
export interface DlqEntryView {
  id: number;
  job_id: string;
  job_data: Record<string, unknown>;
  error_type: string;
  error_message: string;
  retry_count: number;
  created_at: string;
  client_ip: string | null;
  correlation_id: string | null;
}

/** A page (SPEC §2.8). */
export interface Page<T> {
  items: T[];
  limit: number;
  offset: number;
  has_more: boolean;
  count: number;
}

/** The shared queue's depth and age, per job type too (`GET /pool/stats`). */
export interface QueueStatsView {
  queued: number;
  running: number;
  oldest_queued_age_ms: number | null;
  by_job_type: Record<string, { queued: number; running: number }>;
}

const iso = (d: Date | string | null): string | null => (d === null ? null : new Date(d).toISOString());

/** Reads for the API over one database. */
export class History {
  constructor(
    private readonly db: Db,
    private readonly clock: Clock = systemClock,
  ) {}

  /** `postgres` or `pglite`. */
  get kind(): Db['kind'] {
    return this.db.kind;
  }

  /** The stored record, or undefined. */
  find(id: string): Promise<StoredRecord | undefined> {
    return getExecution(this.db.kysely, id);
  }

  /** SPEC §4.3 status of a record. */
  statusOf(row: StoredRecord): JobStatusView {
    return {
      job_id: row.id,
      status: row.status as RecordStatus,
      job_type: row.job_type,
      created_at: iso(row.created_at)!,
      started_at: iso(row.started_at),
      ended_at: iso(row.ended_at),
    };
  }

  /** SPEC §2.3 record view; `full` adds the extended fields, artifacts included. */
  async recordOf(row: StoredRecord, full: boolean): Promise<Record<string, unknown>> {
    return recordView(row, full, full ? await listArtifacts(this.db.kysely, row.id) : []);
  }

  /** Newest first; `status` may be the queue's `pending` (meaning `queued`). */
  async list(f: { status?: (typeof STATUS_FILTERS)[number] | undefined; jobType?: string | undefined; limit: number; offset: number; full: boolean }): Promise<Page<Record<string, unknown>>> {
    const db = this.db.kysely;
    const status = f.status ? recordStatusOf(f.status) : undefined;
    const filter = { status, jobType: f.jobType, limit: f.limit, offset: f.offset };
    if (!f.full) {
      const { rows, hasMore } = await listBrief(db, filter);
      return { items: rows.map(briefView), limit: f.limit, offset: f.offset, has_more: hasMore, count: rows.length };
    }
    const { rows, hasMore } = await listExecutions(db, filter);
    const arts = await listArtifactsFor(db, rows.map((r) => r.id));
    const items = rows.map((r) => recordView(r, true, arts.filter((a) => a.execution_id === r.id)));
    return { items, limit: f.limit, offset: f.offset, has_more: hasMore, count: items.length };
  }

  /**
   * An artifact of a record: the input files `_code.py` / `_input.json` come from the record itself,
   * output files from the store (kept ones only). `withData` false reads no bytes (HEAD, 304).
   */
  async artifact(row: StoredRecord, name: string, withData: boolean): Promise<ArtifactFile | undefined> {
    const input = inputArtifactFiles(row).find((f) => f.view.name === name);
    if (input) return { data: input.data, sha256: input.view.sha256, contentType: input.view.content_type, size: input.view.size_bytes };
    const a = await getArtifact(this.db.kysely, row.id, name, withData);
    return a ? { data: a.data, sha256: a.sha256, contentType: a.content_type, size: Number(a.size_bytes) } : undefined;
  }

  /** A record's webhook deliveries with their attempts (`GET /jobs/{id}/deliveries`). */
  deliveries(id: string): ReturnType<typeof listDeliveries> {
    return listDeliveries(this.db.kysely, id);
  }

  /** 1-based position among queued records; null when not queued. */
  queuePosition(id: string): Promise<number | null> {
    return queuePosition(this.db.kysely, id);
  }

  /** Queued and running counts. */
  queueCounts(): Promise<{ queued: number; running: number }> {
    return queueCounts(this.db.kysely);
  }

  /** Queue depth, age of the oldest queued record and per-job-type counts. */
  async queueStats(): Promise<QueueStatsView> {
    const rows = await this.db.kysely
      .selectFrom('executions')
      .select(['job_type', 'status'])
      .select((eb) => [eb.fn.countAll<number>().as('n'), eb.fn.min('created_at').as('oldest')])
      .where('status', 'in', ['queued', 'running'])
      .groupBy(['job_type', 'status'])
      .execute();
    const out: QueueStatsView = { queued: 0, running: 0, oldest_queued_age_ms: null, by_job_type: {} };
    let oldest: number | null = null;
    for (const row of rows) {
      const n = Number(row.n);
      const t = (out.by_job_type[row.job_type] ??= { queued: 0, running: 0 });
      if (row.status === 'queued') {
        t.queued += n;
        out.queued += n;
        if (row.oldest) oldest = Math.min(oldest ?? Infinity, new Date(row.oldest).getTime());
      } else {
        t.running += n;
        out.running += n;
      }
    }
    if (oldest !== null) out.oldest_queued_age_ms = Math.max(0, this.clock.now() - oldest);
    return out;
  }

  /** Resolves when the database answers a trivial query; rejects otherwise. */
  async ping(): Promise<void> {
    await sql`SELECT 1`.execute(this.db.kysely);
  }

  /** DLQ entries newest first, optionally of one error type. */
  async dlqPage(f: { errorType?: string | undefined; limit: number; offset: number }): Promise<Page<DlqEntryView>> {
    const { rows, hasMore } = await listDlq(this.db.kysely, f);
    const items = rows.map(dlqView);
    return { items, limit: f.limit, offset: f.offset, has_more: hasMore, count: items.length };
  }

  /** SPEC §2.9 statistics. */
  dlqStats(): Promise<{ total: number; by_error_type: Record<string, number> }> {
    return dlqStats(this.db.kysely);
  }

  /** Removes a DLQ entry; false when there was none. */
  deleteDlq(id: number): Promise<boolean> {
    return deleteDlq(this.db.kysely, id);
  }
}

function dlqView(r: DlqRow): DlqEntryView {
  return {
    id: Number(r.id),
    job_id: r.job_id,
    job_data: r.job_data as Record<string, unknown>,
    error_type: r.error_type,
    error_message: r.error_message,
    retry_count: r.retry_count,
    created_at: iso(r.created_at)!,
    client_ip: r.client_ip,
    correlation_id: r.correlation_id,
  };
}
