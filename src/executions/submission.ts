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
import { underAdmission, type QueueDepth } from '../queue/admission.ts';
import { getExecution, insertExecutions, insertIdempotent, type Q } from '../store/executions.repository.ts';
import { insertArtifacts } from '../store/artifacts.repository.ts';
import { inputFileArtifacts, loadInputFiles, resolveInputFiles } from './input-files.ts';
import { buildRow, type RequestMeta, type Submission } from './requests.ts';
import { isTerminal } from './status.ts';

/** What a submission answers with: the job's identity and lineage, not its whole record. */
export type SubmittedJob = Pick<ExecutionRow, 'id' | 'status' | 'job_type' | 'created_at' | 'idempotency_key' | 'parent_execution_id' | 'relationship'>;

/** A job's origin when it re-runs or forks another. */
export interface Lineage {
  parentId: string;
  relationship: 'rerun' | 'fork';
}

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
  /**
   * Concurrent submissions without a key share one admission (one transaction: lock, count, INSERT
   * of those that fit, which also wakes the dispatchers); each learns whether it was admitted.
   */
  private readonly inserts: Batcher<NewExecutionRow, QueueDepth | null>;

  constructor(private readonly o: SubmissionsOptions) {
    this.inserts = new Batcher((rows) =>
      underAdmission(o.db.kysely, o.config.max_queue_size, async (tx, room, depth) => {
        await insertExecutions(tx, rows.slice(0, room), QUEUED_CHANNEL);
        const full = rows.length > room ? await depth() : null;
        return rows.map((_, i) => (i < room ? null : full));
      }),
    );
  }

  /**
   * Queues a submission (SPEC §4.2), or refuses it with `queue_full` (503) when `max_queue_size`
   * jobs are queued or running (all processes; exact under concurrency). With an idempotency key: the
   * same payload returns the existing job (`created: false`), even when the queue is full; a different
   * payload is a 409 naming it — also when two first submissions race and this one lost the insert.
   * A key whose job failed by an infrastructure fault before its code started
   * (`failed_before_start`) names a new job instead: the old record keeps the key as
   * `retired_idempotency_key`, and the answer is the new job (`created: true`).
   */
  async submit(submission: Submission, meta: RequestMeta, lineage?: Lineage): Promise<{ row: SubmittedJob; created: boolean }> {
    const { config, registry, db } = this.o;
    const files = submission.files ?? (await resolveInputFiles(db.kysely, config, submission.input_files, submission.input_artifacts));
    const s = { ...submission, files };
    const row = buildRow(config, registry, s, { mode: 'async', status: 'queued', meta, now: new Date(this.o.clock.now()), ...lineage });
    const withFiles = async (tx: Q) => insertArtifacts(tx, inputFileArtifacts(row.id, files));
    if (!row.idempotency_key && files.length > 0) {
      // With files: the record and its files in one transaction, so no dispatcher claims a run whose
      // files are not there yet (the batcher inserts records only).
      await underAdmission(db.kysely, config.max_queue_size, async (tx, room, depth) => {
        if (room < 1) throw queueFull(await depth(), config.max_queue_size);
        await insertExecutions(tx, [row], QUEUED_CHANNEL);
        await withFiles(tx);
      });
    } else if (!row.idempotency_key) {
      const full = await this.inserts.add(row);
      if (full) throw queueFull(full, config.max_queue_size);
    }
    if (!row.idempotency_key) {
      const { id, status, job_type, created_at, parent_execution_id = null, relationship = null } = row;
      return { row: { id, status, job_type, created_at: created_at as Date, idempotency_key: null, parent_execution_id, relationship }, created: true };
    }
    const key = row.idempotency_key;
    const hash = row.payload_hash ?? null;
    const res = await underAdmission(db.kysely, config.max_queue_size, async (tx, room, depth) => {
      // A replay of a known key returns its job even when the queue is full: look before admission.
      const existing = await byKey(tx, key);
      if (existing) {
        const same = sameKey(existing, hash);
        if (!existing.failed_before_start) return same;
      }
      if (room < 1) throw queueFull(await depth(), config.max_queue_size);
      if (existing) await retireKey(tx, existing.id);
      // The insert still settles a race with a first submission of the key not yet committed.
      const r = await insertIdempotent(tx, row);
      if (r.created) await withFiles(tx);
      return r.created ? r : sameKey(r.row, hash);
    });
    if (res.created) this.o.notifier.notify();
    return res;
  }

  /** Re-runs a finished job with the same code, input, job type and settings (SPEC §4.6). */
  async rerun(id: string, meta: RequestMeta, callbackUrl?: string | null): Promise<SubmittedJob> {
    const parent = await this.mustGetFinished(id, 'rerun');
    return (await this.submit({ ...(await this.submissionOf(parent)), ...withCallback(callbackUrl) }, meta, { parentId: parent.id, relationship: 'rerun' })).row;
  }

  /** Forks a finished job: new code, the original input, job type and settings (SPEC §4.7). */
  async fork(id: string, code: string, meta: RequestMeta, callbackUrl?: string | null): Promise<SubmittedJob> {
    const parent = await this.mustGetFinished(id, 'fork');
    return (await this.submit({ ...(await this.submissionOf(parent)), code, ...withCallback(callbackUrl) }, meta, { parentId: parent.id, relationship: 'fork' })).row;
  }

  /** The submission a finished record was made from, its input files included (for rerun and fork). */
  private async submissionOf(row: ExecutionRow): Promise<Submission> {
    return { ...submissionOf(row), files: row.input_files > 0 ? await loadInputFiles(this.o.db.kysely, row.id) : [] };
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

/** The job that holds idempotency key `key`, if any. */
function byKey(q: Q, key: string): Promise<ExecutionRow | undefined> {
  return q.selectFrom('executions').selectAll().where('idempotency_key', '=', key).executeTakeFirst();
}

/** Moves the key of a job that failed before its code started aside, so that a new job can take it. */
async function retireKey(q: Q, id: string): Promise<void> {
  await q
    .updateTable('executions')
    .set((eb) => ({ retired_idempotency_key: eb.ref('idempotency_key'), idempotency_key: null }))
    .where('id', '=', id)
    .where('failed_before_start', '=', true)
    .execute();
}

/** The 503 of a full queue, naming its depth. */
function queueFull({ queued, running }: QueueDepth, max: number): AppError {
  return new AppError('queue_full', `queue is full: ${queued} queued and ${running} running jobs (max_queue_size ${max}); retry later`, {
    queued,
    running,
    max_queue_size: max,
  });
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

/** A rerun's or fork's own callback, when it names one (null included: it opts out). */
function withCallback(callbackUrl: string | null | undefined): Pick<Submission, 'callback_url'> {
  return callbackUrl !== undefined ? { callback_url: callbackUrl } : {};
}

/**
 * The submission a finished record was made from (for rerun and fork). Its callback goes along (the
 * job's settings are kept); the new job's own `callback_url`, when given, replaces it.
 */
function submissionOf(row: ExecutionRow): Submission {
  return {
    ...(row.callback_url !== null ? { callback_url: row.callback_url } : {}),
    code: row.code,
    input_data: row.input_data as Record<string, unknown>,
    timeout: row.timeout_s,
    startup_timeout: row.startup_timeout_s,
    job_type: row.job_type,
    requirements: row.requirements,
  };
}
