/**
 * The webhook outbox's SQL (migration 0007): claims of due deliveries, the record of each attempt,
 * and the read of `GET /jobs/{id}/deliveries`. The outbox rows themselves are written by the trigger
 * on `executions`, in the verdict's transaction.
 */
import { sql, type Kysely } from 'kysely';
import type { Database, ExecutionRow } from '../store/database.ts';
import { insertDlq } from '../store/dlq.repository.ts';
import type { Q } from '../store/executions.repository.ts';
import type { AttemptDecision } from './decide.ts';

/** The channel the trigger notifies when a delivery is due. */
export const WEBHOOKS_CHANNEL = 'sandpod_webhooks';

/** A claimed delivery. */
export interface ClaimedDelivery {
  id: string;
  execution_id: string;
  url: string;
  attempts: number;
  first_attempt_at: Date | null;
}

/**
 * Claims up to `limit` due deliveries for `workerId` until `leaseUntil`: due (its time came, by the
 * caller's clock) and not held by a live lease. `FOR UPDATE SKIP LOCKED` in one statement, so two
 * replicas claiming at once take different rows; the lease keeps them apart afterwards, and lets
 * another worker send a delivery whose worker died (at least once).
 */
export async function claimDue(db: Q, workerId: string, now: Date, leaseUntil: Date, limit: number): Promise<ClaimedDelivery[]> {
  const r = await sql<ClaimedDelivery>`
    UPDATE webhook_deliveries SET lease_until = ${leaseUntil}, claimed_by = ${workerId}
    WHERE id IN (
      SELECT id FROM webhook_deliveries
      WHERE status = 'pending' AND (next_attempt_at IS NULL OR next_attempt_at <= ${now})
        AND (lease_until IS NULL OR lease_until <= ${now})
      ORDER BY next_attempt_at NULLS FIRST, created_at
      LIMIT ${limit}
      FOR UPDATE SKIP LOCKED)
    RETURNING id, execution_id, url, attempts, first_attempt_at`.execute(db);
  return r.rows.map((x) => ({ ...x, first_attempt_at: x.first_attempt_at === null ? null : new Date(x.first_attempt_at) }));
}

/** The earliest time a pending delivery falls due, or null (the worker sleeps until then). */
export async function nextDueAt(db: Q): Promise<Date | null> {
  const r = await sql<{ at: Date | null }>`
    SELECT min(greatest(coalesce(next_attempt_at, '-infinity'), coalesce(lease_until, '-infinity'))) AS at
    FROM webhook_deliveries WHERE status = 'pending'`.execute(db);
  const at = r.rows[0]?.at ?? null;
  if (at === null) return null;
  const d = new Date(at);
  return Number.isFinite(d.getTime()) ? d : new Date(0);
}

/** One attempt as recorded. */
export interface AttemptRecord {
  attempt: number;
  startedAt: Date;
  durationMs: number;
  statusCode: number | null;
  error: string | null;
}

/**
 * Records an attempt and what follows it, in one transaction: the attempt row, the delivery's new state
 * (only while this worker still holds it), and for a delivery given up, its DLQ entry
 * (`webhook_failed`). Returns false when the delivery was no longer ours (the lease ran out and
 * another worker took it): nothing is written.
 */
export async function recordAttempt(db: Q, d: ClaimedDelivery, workerId: string, a: AttemptRecord, decision: AttemptDecision, now: Date): Promise<boolean> {
  const write = async (tx: Q) => {
    const status = decision.outcome === 'retried' ? 'pending' : decision.outcome;
    const updated = await tx
      .updateTable('webhook_deliveries')
      .set({
        status,
        attempts: a.attempt,
        first_attempt_at: d.first_attempt_at ?? a.startedAt,
        next_attempt_at: decision.outcome === 'retried' ? new Date(decision.nextAttemptAt) : null,
        lease_until: null,
        claimed_by: null,
        last_status_code: a.statusCode,
        last_error: decision.outcome === 'failed' ? decision.reason : a.error,
        ended_at: decision.outcome === 'retried' ? null : now,
      })
      .where('id', '=', d.id)
      .where('status', '=', 'pending')
      .where('claimed_by', '=', workerId)
      .returning('id')
      .executeTakeFirst();
    if (!updated) return false;
    await tx
      .insertInto('webhook_attempts')
      .values({ delivery_id: d.id, attempt: a.attempt, started_at: a.startedAt, duration_ms: a.durationMs, status_code: a.statusCode, error: a.error, outcome: decision.outcome })
      .execute();
    if (decision.outcome === 'failed') {
      const row = await tx.selectFrom('executions').selectAll().where('id', '=', d.execution_id).executeTakeFirst();
      if (row) await insertDlq(tx, dlqEntry(row, d, a.attempt, decision.reason));
    }
    return true;
  };
  return db.isTransaction ? write(db) : (db as Kysely<Database>).transaction().execute(write);
}

function dlqEntry(row: ExecutionRow, d: ClaimedDelivery, attempts: number, reason: string) {
  return {
    jobId: row.id,
    jobData: { code: row.code, input_data: row.input_data, job_type: row.job_type, callback_url: d.url, webhook_id: d.id },
    errorType: 'webhook_failed',
    errorMessage: `webhook to ${new URL(d.url).host} not delivered: ${reason}`,
    retryCount: Math.max(0, attempts - 1),
    clientIp: row.client_ip,
    correlationId: row.correlation_id,
  };
}

/** `GET /jobs/{id}/deliveries`: a record's deliveries with their attempts, oldest first. */
export async function listDeliveries(db: Q, executionId: string) {
  const deliveries = await db.selectFrom('webhook_deliveries').selectAll().where('execution_id', '=', executionId).orderBy('created_at').execute();
  const ids = deliveries.map((d) => d.id);
  const attempts = ids.length === 0 ? [] : await db.selectFrom('webhook_attempts').selectAll().where('delivery_id', 'in', ids).orderBy('delivery_id').orderBy('attempt').orderBy('id').execute();
  const iso = (t: Date | string | null) => (t === null ? null : new Date(t).toISOString());
  return deliveries.map((d) => ({
    webhook_id: d.id,
    url: d.url,
    status: d.status,
    attempt_count: d.attempts,
    created_at: iso(d.created_at)!,
    next_attempt_at: d.status === 'pending' ? iso(d.next_attempt_at ?? d.created_at) : null,
    ended_at: iso(d.ended_at),
    last_status_code: d.last_status_code,
    last_error: d.last_error,
    attempts: attempts
      .filter((a) => a.delivery_id === d.id)
      .map((a) => ({ attempt: a.attempt, started_at: iso(a.started_at)!, duration_ms: a.duration_ms, status_code: a.status_code, error: a.error, outcome: a.outcome })),
  }));
}
