/**
 * Submission of queued work (SPEC §4.2, §4.6, §4.7): admission against `max_queue_size`,
 * idempotency keys, rerun and fork. Writes the `queued` record and wakes the dispatchers; running it
 * is `running.ts`'s job.
 */
import type { Clock } from '../clock.ts';
import type { Config } from '../config.ts';
import { AppError } from '../errors.ts';
import type { JobTypeRegistry } from '../jobtypes/job-type.ts';
import { QUEUED_CHANNEL, type QueuedNotifier } from '../queue/channels.ts';
import { Batcher } from '../store/batcher.ts';
import type { Db, ExecutionRow, NewExecutionRow } from '../store/database.ts';
import { activeCountUpTo, getExecution, insertExecutions, insertIdempotent, queueCounts } from '../store/executions.repository.ts';
import { buildRow, type RequestMeta, type Submission } from './requests.ts';
import { isTerminal } from './status.ts';

/** What a submission answers with: the job's identity and lineage, not its whole record. */
export type SubmittedJob = Pick<ExecutionRow, 'id' | 'status' | 'job_type' | 'created_at' | 'idempotency_key' | 'parent_execution_id' | 'relationship'>;

/** A job's origin when it re-runs or forks another. */
export interface Lineage {
  parentId: string;
  relationship: 'rerun' | 'fork';
}

/** How long a queue depth count is reused while far from `max_queue_size`. */
const DEPTH_TTL_MS = 200;

/** Options of {@link Submissions}. */
export interface SubmissionsOptions {
  db: Db;
  registry: JobTypeRegistry;
  config: Config;
  clock: Clock;
  notifier: QueuedNotifier;
}

/** Puts work in the queue. */
export class Submissions {
  private depth = { value: 0, at: Number.NEGATIVE_INFINITY };
  /** Concurrent submissions without a key share one INSERT, which also wakes the dispatchers. */
  private readonly inserts: Batcher<NewExecutionRow, undefined>;

  constructor(private readonly o: SubmissionsOptions) {
    this.inserts = new Batcher(async (rows) => {
      await insertExecutions(o.db.kysely, rows, QUEUED_CHANNEL);
      return rows.map(() => undefined);
    });
  }

  /**
   * Queues a submission (SPEC §4.2). With an idempotency key: the same payload returns the existing
   * job (`created: false`); a different payload is a 409 naming it — also when two first submissions
   * race and this one lost the insert.
   */
  async submit(s: Submission, meta: RequestMeta, lineage?: Lineage): Promise<{ row: SubmittedJob; created: boolean }> {
    const { config, registry, db } = this.o;
    const row = buildRow(config, registry, s, { mode: 'async', status: 'queued', meta, now: new Date(this.o.clock.now()), ...lineage });
    // A replay of a known key returns its job even when the queue is full, so look before admission;
    // the insert below still settles a race between concurrent first submissions.
    if (row.idempotency_key) {
      const existing = await db.kysely.selectFrom('executions').selectAll().where('idempotency_key', '=', row.idempotency_key).executeTakeFirst();
      if (existing) return sameKey(existing, row.payload_hash ?? null);
    }
    await this.ensureQueueRoom();
    if (!row.idempotency_key) {
      await this.inserts.add(row);
      const { id, status, job_type, created_at, parent_execution_id = null, relationship = null } = row;
      return { row: { id, status, job_type, created_at: created_at as Date, idempotency_key: null, parent_execution_id, relationship }, created: true };
    }
    const res = await insertIdempotent(db.kysely, row);
    if (!res.created) return sameKey(res.row, row.payload_hash ?? null);
    this.o.notifier.notify();
    return res;
  }

  /** Re-runs a finished job with the same code, input, job type and settings (SPEC §4.6). */
  async rerun(id: string, meta: RequestMeta): Promise<SubmittedJob> {
    const parent = await this.mustGetFinished(id, 'rerun');
    return (await this.submit(submissionOf(parent), meta, { parentId: parent.id, relationship: 'rerun' })).row;
  }

  /** Forks a finished job: new code, the original input, job type and settings (SPEC §4.7). */
  async fork(id: string, code: string, meta: RequestMeta): Promise<SubmittedJob> {
    const parent = await this.mustGetFinished(id, 'fork');
    return (await this.submit({ ...submissionOf(parent), code }, meta, { parentId: parent.id, relationship: 'fork' })).row;
  }

  /**
   * Admission against `max_queue_size` (queued + running, all processes). The depth is re-counted at
   * most every {@link DEPTH_TTL_MS} while far from the bound and on every submission near it, so the
   * check costs nothing on the hot path yet is exact where it matters; concurrent submitters in
   * several processes can overshoot the bound by at most their in-flight submissions.
   */
  private async ensureQueueRoom(): Promise<void> {
    const max = this.o.config.max_queue_size;
    const now = this.o.clock.now();
    const near = this.depth.value >= max - Math.max(10, Math.ceil(max * 0.1));
    if (near || now - this.depth.at > DEPTH_TTL_MS || now < this.depth.at) this.depth = { value: await activeCountUpTo(this.o.db.kysely, max), at: now };
    if (this.depth.value >= max) {
      const { queued, running } = await queueCounts(this.o.db.kysely);
      throw new AppError('queue_full', `queue is full: ${queued} queued and ${running} running jobs (max_queue_size ${max}); retry later`, {
        queued,
        running,
        max_queue_size: max,
      });
    }
    this.depth.value += 1;
  }

  private async mustGetFinished(id: string, what: string): Promise<ExecutionRow> {
    const row = await getExecution(this.o.db.kysely, id);
    if (!row) throw new AppError('not_found', `job '${id}' not found`);
    if (!isTerminal(row.status)) {
      throw new AppError('conflict', `job '${id}' is ${row.status}; only a finished job can be used for a ${what}`, { status: row.status });
    }
    return row;
  }
}

/** The existing job of a key, or the 409 of SPEC §4.2 rule 3 when the payload differs. */
function sameKey(existing: ExecutionRow, payloadHash: string | null): { row: ExecutionRow; created: boolean } {
  if (existing.payload_hash !== payloadHash) {
    throw new AppError('idempotency_conflict', `idempotency_key '${existing.idempotency_key}' was already used with a different payload`, {
      existing_job_id: existing.id,
    });
  }
  return { row: existing, created: false };
}

/** The submission a finished record was made from (for rerun and fork). */
function submissionOf(row: ExecutionRow): Submission {
  return {
    code: row.code,
    input_data: row.input_data as Record<string, unknown>,
    timeout: row.timeout_s,
    startup_timeout: row.startup_timeout_s,
    job_type: row.job_type,
    requirements: row.requirements,
  };
}
