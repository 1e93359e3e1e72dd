/**
 * The record lifecycle (SPEC §3): create, run through the runtime (breaker + retry), finalize once,
 * cancel, rerun/fork, settle orphans after a crash. Knows nothing of HTTP.
 */
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import type { Config } from '../config.ts';
import { AppError, errorMessage } from '../errors.ts';
import type { JobTypeRegistry } from '../jobtypes/job-type.ts';
import type { Logger } from '../logger.ts';
import type { Slots } from '../queue/slots.ts';
import { BreakerOpenError, type CircuitBreaker } from '../resilience/breaker.ts';
import { RetriesExhaustedError, withRetry } from '../resilience/retry.ts';
import { RunGoneError, type RawRun, type Runtime, type RunSpec } from '../runtime/runtime.ts';
import { insertArtifacts, type NewArtifact } from '../store/artifacts.repository.ts';
import type { Kysely, Transaction } from 'kysely';
import { Batcher } from '../store/batcher.ts';
import type { Database, Db, ExecutionRow, ExecutionUpdate, NewExecutionRow } from '../store/database.ts';
import { insertDlq } from '../store/dlq.repository.ts';
import {
  activeCountUpTo,
  claimNext,
  getExecution,
  heartbeat,
  insertExecution,
  insertExecutions,
  insertIdempotent,
  queueCounts,
  runningHolders,
  settleRunning,
  TERMINAL_STATUSES,
  updateExecutionIf,
} from '../store/executions.repository.ts';
import { classify, type Classification, type RunError } from './classify.ts';
import { buildRow, mergedRequirements, resolveJobType, type RequestMeta, type Submission } from './requests.ts';
import { inputJsonOf } from './views.ts';

/** NOTIFY channel: an execution reached a terminal status (payload: id). */
export const DONE_CHANNEL = 'sandpod_done';
/** NOTIFY channel: work was queued (empty payload: a wake-up; dispatchers claim from the table). */
export const QUEUED_CHANNEL = 'sandpod_queued';
/** NOTIFY channel: cancellation of a running execution was requested (payload: id). */
export const CANCEL_CHANNEL = 'sandpod_cancel';

/** What a submission answers with: the job's identity and lineage, not its whole record. */
export type SubmittedJob = Pick<ExecutionRow, 'id' | 'status' | 'job_type' | 'created_at' | 'idempotency_key' | 'parent_execution_id' | 'relationship'>;

/** How long a queue depth count is reused while far from `max_queue_size`. */
const DEPTH_TTL_MS = 200;

/** Error types whose runs are put in the dead letter queue (SPEC §7.3 rule 7). */
export const DLQ_ERROR_TYPES = new Set(['internal_error', 'service_unavailable', 'docker_error', 'config_error']);

/** Observers for metrics; all optional. */
export interface ExecutionEvents {
  onFinished?(row: ExecutionRow): void;
  onStarted?(row: ExecutionRow): void;
}

/** Dependencies of {@link Executions}. */
export interface ExecutionsOptions {
  db: Db;
  registry: JobTypeRegistry;
  runtime: Runtime;
  breaker: CircuitBreaker;
  config: Config;
  logger: Logger;
  slots: Slots;
  workerId?: string;
  now?: () => Date;
  /** Sleep used between retries (tests make it instant). */
  sleep?: (ms: number) => Promise<void>;
  /** Heartbeat period of held runs; a holder silent for 5 periods is presumed dead. */
  heartbeatMs?: number;
  events?: ExecutionEvents;
}

/** Why a held run was aborted. */
type AbortReason = 'cancel' | 'shutdown';

/** Record lifecycle service. */
export class Executions {
  readonly workerId: string;
  private readonly db: Db;
  private readonly o: ExecutionsOptions;
  private readonly now: () => Date;
  private readonly held = new Map<string, AbortController>();
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private sweepTimer: NodeJS.Timeout | null = null;
  private sweeping = false;
  private depth = { value: 0, at: 0 };
  private readonly queuedNotify = { inFlight: false, again: false };
  /** Concurrent async submissions share one INSERT. */
  private readonly inserts: Batcher<NewExecutionRow, undefined>;
  private unlistenCancel: (() => Promise<void>) | null = null;
  readonly heartbeatMs: number;

  constructor(o: ExecutionsOptions) {
    this.o = o;
    this.db = o.db;
    this.now = o.now ?? (() => new Date());
    this.workerId = o.workerId ?? `${hostname()}/${process.pid}/${randomBytes(4).toString('hex')}`;
    this.heartbeatMs = o.heartbeatMs ?? 2000;
    // The insert itself wakes the dispatchers (all processes).
    this.inserts = new Batcher(async (rows) => {
      await insertExecutions(this.db.kysely, rows, QUEUED_CHANNEL);
      return rows.map(() => undefined);
    });
  }

  /**
   * Starts heartbeats, the cross-process cancel listener, and a sweep that takes over runs of
   * processes that died while this one is up (other replicas), every 5 heartbeats.
   */
  async start(): Promise<void> {
    this.unlistenCancel = await this.db.listen(CANCEL_CHANNEL, (id) => this.abortHeld(id, 'cancel'));
    this.heartbeatTimer = setInterval(() => void this.beat(), this.heartbeatMs);
    this.heartbeatTimer.unref();
    this.sweepTimer = setInterval(() => void this.sweep(), this.heartbeatMs * 5);
    this.sweepTimer.unref();
  }

  private async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      await this.recoverOrphans();
    } catch (err) {
      this.o.logger.warn({ err: errorMessage(err) }, 'orphan sweep failed');
    } finally {
      this.sweeping = false;
    }
  }

  /** Stops listeners; runs still held are left to {@link abortAll}. */
  async stop(): Promise<void> {
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    this.heartbeatTimer = null;
    this.sweepTimer = null;
    await this.unlistenCancel?.();
    this.unlistenCancel = null;
  }

  /** Aborts every held run (shutdown): async runs go back to the queue, sync ones fail. */
  abortAll(): void {
    for (const id of this.held.keys()) this.abortHeld(id, 'shutdown');
  }

  // ---- submission ---------------------------------------------------------------------------

  /** Runs a submission synchronously: takes a worker slot, records, runs, finalizes. */
  async runSync(s: Submission, meta: RequestMeta, signal?: AbortSignal): Promise<ExecutionRow> {
    const row = buildRow(this.o.config, this.o.registry, s, { mode: 'sync', status: 'running', meta, workerId: this.workerId, now: this.now() });
    await this.o.slots.acquire(true, signal);
    let released = false;
    const release = () => {
      if (!released) this.o.slots.release();
      released = true;
    };
    try {
      const done = await this.execute(await insertExecution(this.db.kysely, row), { release });
      // execute() settles every run it can; a record it could not write (database gone) must not be
      // answered as if it were a result.
      if (!(TERMINAL_STATUSES as readonly string[]).includes(done.status)) {
        throw new AppError('internal_error', `the run's result could not be recorded; execution ${done.id} is left ${done.status} and will be settled by recovery`, {
          execution_id: done.id,
        });
      }
      return done;
    } finally {
      release();
    }
  }

  /**
   * Queues a submission (SPEC §4.2). With an idempotency key: the same payload returns the existing
   * job; a different payload is a 409 naming it.
   */
  async submitAsync(s: Submission, meta: RequestMeta, lineage?: { parentId: string; relationship: 'rerun' | 'fork' }): Promise<{ row: SubmittedJob; created: boolean }> {
    const row = buildRow(this.o.config, this.o.registry, s, { mode: 'async', status: 'queued', meta, now: this.now(), ...lineage });
    // A replay of a known key returns its job even when the queue is full, so look before admission;
    // insertIdempotent below still settles the race between concurrent first submissions.
    if (row.idempotency_key) {
      const existing = await this.db.kysely.selectFrom('executions').selectAll().where('idempotency_key', '=', row.idempotency_key).executeTakeFirst();
      if (existing) return this.sameKey(existing, row.payload_hash ?? null);
    }
    await this.ensureQueueRoom();
    if (!row.idempotency_key) {
      await this.inserts.add(row);
      const { id, status, job_type, created_at, parent_execution_id = null, relationship = null } = row;
      return { row: { id, status, job_type, created_at: created_at as Date, idempotency_key: null, parent_execution_id, relationship }, created: true };
    }
    const res = await insertIdempotent(this.db.kysely, row);
    if (!res.created) return this.sameKey(res.row, row.payload_hash ?? null);
    this.notifyQueued();
    return res;
  }

  /**
   * Wakes dispatchers (all processes). Coalesced: a NOTIFY is only a wake-up (dispatchers claim from
   * the table), so one in flight plus one pending covers any number of submissions.
   */
  private notifyQueued(): void {
    if (this.queuedNotify.inFlight) {
      this.queuedNotify.again = true;
      return;
    }
    this.queuedNotify.inFlight = true;
    void this.db
      .notify(QUEUED_CHANNEL, '')
      .catch(() => {})
      .finally(() => {
        this.queuedNotify.inFlight = false;
        if (this.queuedNotify.again) {
          this.queuedNotify.again = false;
          this.notifyQueued();
        }
      });
  }

  private sameKey(existing: ExecutionRow, payloadHash: string | null): { row: ExecutionRow; created: boolean } {
    if (existing.payload_hash !== payloadHash) {
      throw new AppError('idempotency_conflict', `idempotency_key '${existing.idempotency_key}' was already used with a different payload`, {
        existing_job_id: existing.id,
      });
    }
    return { row: existing, created: false };
  }

  /**
   * Admission against `max_queue_size` (queued + running, all processes). The depth is re-counted at
   * most every {@link DEPTH_TTL_MS} while far from the bound and on every submission near it, so the
   * check costs nothing on the hot path yet is exact where it matters; concurrent submitters in
   * several processes can overshoot the bound by at most their in-flight submissions.
   */
  private async ensureQueueRoom(): Promise<void> {
    const max = this.o.config.max_queue_size;
    const now = Date.now();
    const near = this.depth.value >= max - Math.max(10, Math.ceil(max * 0.1));
    if (near || now - this.depth.at > DEPTH_TTL_MS) this.depth = { value: await activeCountUpTo(this.db.kysely, max), at: now };
    if (this.depth.value >= max) {
      const { queued, running } = await queueCounts(this.db.kysely);
      throw new AppError('queue_full', `queue is full: ${queued} queued and ${running} running jobs (max_queue_size ${max}); retry later`, {
        queued,
        running,
        max_queue_size: max,
      });
    }
    this.depth.value += 1;
  }

  /** Re-runs a finished job with the same code, input, job type and settings (SPEC §4.6). */
  async rerun(id: string, meta: RequestMeta): Promise<SubmittedJob> {
    const parent = await this.mustGetFinished(id, 'rerun');
    const { row } = await this.submitAsync(this.submissionOf(parent), meta, { parentId: parent.id, relationship: 'rerun' });
    return row;
  }

  /** Forks a finished job: new code, the original input, job type and settings (SPEC §4.7). */
  async fork(id: string, code: string, meta: RequestMeta): Promise<SubmittedJob> {
    const parent = await this.mustGetFinished(id, 'fork');
    const { row } = await this.submitAsync({ ...this.submissionOf(parent), code }, meta, { parentId: parent.id, relationship: 'fork' });
    return row;
  }

  private submissionOf(row: ExecutionRow): Submission {
    return {
      code: row.code,
      input_data: row.input_data as Record<string, unknown>,
      timeout: row.timeout_s,
      startup_timeout: row.startup_timeout_s,
      job_type: row.job_type,
      requirements: row.requirements,
    };
  }

  private async mustGetFinished(id: string, what: string): Promise<ExecutionRow> {
    const row = await getExecution(this.db.kysely, id);
    if (!row) throw new AppError('not_found', `job '${id}' not found`);
    if (!(TERMINAL_STATUSES as readonly string[]).includes(row.status)) {
      throw new AppError('conflict', `job '${id}' is ${row.status}; only a finished job can be used for a ${what}`, { status: row.status });
    }
    return row;
  }

  // ---- cancellation -------------------------------------------------------------------------

  /**
   * Cancels a job (SPEC §4.5). Queued: cancelled at once. Running: the holder (this process or
   * another, told by NOTIFY) kills the sandbox; waits up to `waitMs` for the record to settle.
   * Already cancelled: returned as is. Otherwise finished: 409.
   */
  async cancel(id: string, waitMs = 10_000, waitFor?: (id: string, ms: number) => Promise<ExecutionRow | undefined>): Promise<ExecutionRow> {
    const row = await getExecution(this.db.kysely, id);
    if (!row) throw new AppError('not_found', `job '${id}' not found`);
    if (row.status === 'cancelled') return row;
    if ((TERMINAL_STATUSES as readonly string[]).includes(row.status)) {
      throw new AppError('conflict', `job '${id}' already finished with status '${row.status}'; nothing to cancel`, { status: row.status });
    }
    const now = this.now();
    const cancelled = await updateExecutionIf(this.db.kysely, id, ['queued'], {
      status: 'cancelled',
      ended_at: now,
      duration_ms: 0,
      error: JSON.stringify({ type: 'cancelled', message: 'cancelled by user before it started' } satisfies RunError),
      timing: JSON.stringify({ startup_ms: 0, dep_install_ms: 0, execution_ms: 0, total_ms: 0, phase_at_exit: 'startup' }),
    });
    if (cancelled) {
      void this.db.notify(DONE_CHANNEL, id).catch(() => {});
      this.o.events?.onFinished?.(cancelled);
      return cancelled;
    }
    await updateExecutionIf(this.db.kysely, id, ['running'], { cancel_requested: true });
    if (!this.abortHeld(id, 'cancel')) await this.db.notify(CANCEL_CHANNEL, id);
    const settled = waitFor ? await waitFor(id, waitMs) : undefined;
    return settled ?? (await getExecution(this.db.kysely, id)) ?? row;
  }

  private abortHeld(id: string, reason: AbortReason): boolean {
    const ac = this.held.get(id);
    if (!ac) return false;
    if (!ac.signal.aborted) ac.abort(reason);
    return true;
  }

  // ---- running ------------------------------------------------------------------------------

  /** Claims the oldest queued job for this process, or undefined. */
  async claim(): Promise<ExecutionRow | undefined> {
    return claimNext(this.db.kysely, this.workerId, this.now());
  }

  /** Runs a record this process holds (status `running`, claimed by us) and finalizes it. */
  async execute(row: ExecutionRow, opts: { adopt?: boolean; release?: () => void } = {}): Promise<ExecutionRow> {
    const ac = new AbortController();
    this.held.set(row.id, ac);
    const log = this.o.logger.child({ execution_id: row.id, correlation_id: row.correlation_id });
    this.o.events?.onStarted?.(row);
    try {
      if (row.cancel_requested) ac.abort('cancel');
      const outcome = await this.runGuarded(row, ac.signal, opts.adopt ?? false, log);
      // The sandbox is gone: its worker slot can serve the next job while this one is recorded.
      opts.release?.();
      if (outcome.kind === 'gone') return await this.settleGone(row, log);
      if (ac.signal.aborted && ac.signal.reason === 'shutdown' && row.mode === 'async') return await this.requeue(row, 'service shut down during the run');
      return await this.finalize(row, outcome, log);
    } catch (err) {
      log.error({ err }, 'finalizing a run failed');
      return await this.finalize(row, { kind: 'internal', type: 'internal_error', message: `internal error: ${errorMessage(err)}`, attempts: 1 }, log).catch(
        () => row,
      );
    } finally {
      this.held.delete(row.id);
    }
  }

  private async runGuarded(row: ExecutionRow, signal: AbortSignal, adopt: boolean, log: Logger): Promise<Outcome> {
    const jt = resolveJobType(this.o.registry, row.job_type);
    const spec: RunSpec = {
      executionId: row.id,
      code: row.code,
      inputJson: inputJsonOf(row),
      jobType: jt,
      timeoutSec: row.timeout_s,
      startupTimeoutSec: row.startup_timeout_s,
      requirements: mergedRequirements(jt, row.requirements),
      maxStdoutBytes: this.o.config.max_stdout_bytes,
      maxArtifactBytes: this.o.config.max_artifact_bytes,
    };
    // The phase only matters to crash recovery of async runs (re-queue before user code started).
    const onPhase = (phase: 'startup' | 'execution') => {
      if (phase === 'execution' && row.mode === 'async') void updateExecutionIf(this.db.kysely, row.id, ['running'], { phase }, this.workerId).catch(() => {});
    };
    let attempts = 0;
    try {
      const raw = await withRetry(
        async (n) => {
          attempts = n;
          return this.o.breaker.exec(() => this.o.runtime.run(spec, { signal, onPhase, adopt }), isEngineFailure);
        },
        {
          attempts: this.o.config.retry.attempts,
          baseDelayMs: this.o.config.retry.base_delay_ms,
          ...(this.o.sleep ? { sleep: this.o.sleep } : {}),
          retryable: (err) => !(err instanceof RunGoneError) && !(err instanceof BreakerOpenError) && !signal.aborted,
          onRetry: (n, err, delay) => log.warn({ attempt: n, delay_ms: delay, err: errorMessage(err) }, 'engine failure; retrying'),
        },
      );
      return { kind: 'ran', raw, attempts };
    } catch (err) {
      if (err instanceof RunGoneError) return { kind: 'gone' };
      if (err instanceof BreakerOpenError) return { kind: 'internal', type: 'service_unavailable', message: err.message, attempts };
      const last = err instanceof RetriesExhaustedError ? err.lastError : err;
      log.error({ err: last, attempts }, 'engine failed');
      return { kind: 'internal', type: 'internal_error', message: `sandbox engine failed after ${attempts} attempt(s): ${errorMessage(last)}`, attempts };
    }
  }

  /** Writes the verdict once (guarded on status `running` and our claim), with artifacts and DLQ. */
  private async finalize(row: ExecutionRow, outcome: Outcome, log: Logger): Promise<ExecutionRow> {
    const now = this.now();
    let c: Classification;
    let raw: RawRun | null = null;
    if (outcome.kind === 'ran') {
      raw = outcome.raw;
      c = classify(raw);
    } else if (outcome.kind === 'internal') {
      c = internalClassification(outcome.type, outcome.message);
    } else throw new Error('unreachable');
    const startedAt = raw?.observation.startedAt ?? row.started_at ?? now;
    const endedAt = raw?.observation.endedAt ?? now;
    const patch: ExecutionUpdate = {
      status: c.status,
      exit_code: c.exitCode,
      error: c.error ? JSON.stringify(c.error) : null,
      output: c.output === null || c.output === undefined ? null : JSON.stringify(c.output),
      stdout: raw?.stdout ?? '',
      stderr: raw?.stderr ?? '',
      stdout_truncated: raw?.stdoutTruncated ?? false,
      stderr_truncated: raw?.stderrTruncated ?? false,
      timing: JSON.stringify(c.timing),
      resource_usage: JSON.stringify(c.resourceUsage),
      started_at: startedAt,
      ended_at: endedAt,
      duration_ms: Math.max(0, Math.round(new Date(endedAt).getTime() - new Date(startedAt).getTime())),
      phase: c.timing.phase_at_exit,
      claimed_by: null,
    };
    const artifacts: NewArtifact[] = (raw?.artifacts ?? []).map((a) => ({
      executionId: row.id,
      kind: 'output',
      name: a.name,
      sizeBytes: a.size,
      sha256: a.sha256,
      contentType: a.contentType,
      data: a.data ?? null,
      skipped: a.skipped ?? null,
    }));
    const attempts = outcome.kind === 'internal' ? outcome.attempts : outcome.kind === 'ran' ? outcome.attempts : 1;
    const toDlq = c.error !== null && DLQ_ERROR_TYPES.has(c.error.type);
    const settle = (q: Kysely<Database> | Transaction<Database>) => settleRunning(q, row.id, this.workerId, patch, DONE_CHANNEL);
    // The common case (no files, no DLQ entry) is one statement; otherwise one short transaction.
    const updated =
      artifacts.length === 0 && !toDlq
        ? await settle(this.db.kysely)
        : await this.db.kysely.transaction().execute(async (tx) => {
            const u = await settle(tx);
            if (!u) return undefined;
            await insertArtifacts(tx, artifacts);
            if (toDlq) {
              await insertDlq(tx, {
                jobId: row.id,
                jobData: { code: row.code, input_data: row.input_data, job_type: row.job_type, timeout: row.timeout_s, startup_timeout: row.startup_timeout_s, requirements: row.requirements },
                errorType: c.error!.type,
                errorMessage: c.error!.message,
                retryCount: Math.max(0, attempts - 1),
                clientIp: row.client_ip,
                correlationId: row.correlation_id,
              });
            }
            return u;
          });
    if (!updated) {
      // Someone else settled it (a cancel of a queued row cannot reach here; another process adopted it).
      log.warn('record was settled elsewhere; result dropped');
      return (await getExecution(this.db.kysely, row.id)) ?? row;
    }
    this.o.events?.onFinished?.(updated);
    log.info({ status: updated.status, error_type: c.error?.type, duration_ms: updated.duration_ms }, 'run finished');
    return updated;
  }

  private async requeue(row: ExecutionRow, why: string): Promise<ExecutionRow> {
    const u = await updateExecutionIf(
      this.db.kysely,
      row.id,
      ['running'],
      { status: 'queued', claimed_by: null, started_at: null, heartbeat_at: null, phase: null },
      this.workerId,
    );
    this.o.logger.info({ execution_id: row.id, why }, 'job returned to the queue');
    if (u) this.notifyQueued();
    return u ?? row;
  }

  /**
   * A run that left nothing to re-attach to (after a crash): async runs that never reached user code
   * go back to the queue; the others fail with `internal_error` and land in the DLQ.
   */
  private async settleGone(row: ExecutionRow, log: Logger): Promise<ExecutionRow> {
    if (row.mode === 'async' && (row.phase === 'startup' || row.phase === null)) return this.requeue(row, 'its process died before user code started');
    return this.finalize(
      row,
      { kind: 'internal', type: 'internal_error', message: 'the service stopped while this job was running (user code had started); it was not re-run', attempts: row.attempts },
      log,
    );
  }

  // ---- crash recovery -----------------------------------------------------------------------

  /**
   * Takes over running records whose holder is dead (stale heartbeat, or a process of this host that
   * no longer exists) and settles them: re-attached when the runtime can, else by {@link settleGone}.
   * Returns the adopted runs' completion promises.
   */
  async recoverOrphans(): Promise<Promise<ExecutionRow>[]> {
    const staleBefore = this.now().getTime() - this.heartbeatMs * 5;
    const out: Promise<ExecutionRow>[] = [];
    for (const r of await runningHolders(this.db.kysely, this.workerId)) {
      const stale = r.heartbeat_at === null || new Date(r.heartbeat_at).getTime() < staleBefore;
      if (!stale && !holderIsDeadHere(r.claimed_by)) continue;
      const adopted = await updateExecutionIf(
        this.db.kysely,
        r.id,
        ['running'],
        { claimed_by: this.workerId, heartbeat_at: this.now() },
        r.claimed_by ?? undefined,
      );
      if (!adopted) continue;
      this.o.logger.warn({ execution_id: r.id, previous_holder: r.claimed_by, phase: adopted.phase }, 'adopting an orphaned run');
      out.push(this.execute(adopted, { adopt: true }));
    }
    return out;
  }

  private async beat(): Promise<void> {
    const ids = [...this.held.keys()];
    if (ids.length === 0) return;
    try {
      // The returned cancel flags are the fallback for a lost NOTIFY from another process.
      for (const id of await heartbeat(this.db.kysely, this.workerId, ids, this.now())) this.abortHeld(id, 'cancel');
    } catch (err) {
      this.o.logger.warn({ err: errorMessage(err) }, 'heartbeat failed');
    }
  }
}

type Outcome = { kind: 'ran'; raw: RawRun; attempts: number } | { kind: 'internal'; type: string; message: string; attempts: number } | { kind: 'gone' };

/** A resolved run counts against the breaker when the machinery (not the user's code) failed. */
function isEngineFailure(raw: RawRun): boolean {
  const t = raw.observation.infraError?.type;
  return t === 'internal_error' || t === 'docker_error';
}

function internalClassification(type: string, message: string): Classification {
  return {
    status: 'failed',
    exitCode: null,
    error: { type, message },
    output: null,
    timing: { startup_ms: 0, dep_install_ms: 0, execution_ms: 0, total_ms: 0, phase_at_exit: 'startup' },
    resourceUsage: { max_rss_mb: 0, cpu_time_ms: 0, wall_time_ms: 0 },
  };
}

/** True when `holder` names a process of this host that is not running any more. */
export function holderIsDeadHere(holder: string | null): boolean {
  if (!holder) return true;
  const [host, pidText] = holder.split('/');
  if (host !== hostname()) return false;
  const pid = Number(pidText);
  if (!Number.isInteger(pid) || pid <= 0) return false;
  if (pid === process.pid) return true; // same pid, different nonce: our previous life
  try {
    process.kill(pid, 0);
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ESRCH';
  }
}
