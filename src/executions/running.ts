/**
 * Running a record this process holds: the guarded run (the one place the breaker + retry policy of
 * `resilience/guard.ts` is applied, for every runtime), then exactly one outcome — the verdict written
 * once (with artifacts and the DLQ), the job given back to the queue (shutdown, or a crash before user
 * code started), or the run settled as lost.
 */
import type { Kysely, Transaction } from 'kysely';
import type { Clock } from '../clock.ts';
import type { Config } from '../config.ts';
import { AppError, errorMessage, UnretryableError } from '../errors.ts';
import type { JobTypeRegistry } from '../jobtypes/job-type.ts';
import type { Logger } from '../logger.ts';
import { DONE_CHANNEL } from '../queue/channels.ts';
import type { Claims, GiveBack } from '../queue/claims.ts';
import type { Holders } from '../queue/holders.ts';
import type { Slots } from '../queue/slots.ts';
import type { RunGuard } from '../resilience/guard.ts';
import { FencedError, LeftRunningError, RunGoneError, type RawRun, type Runtime, type RunSpec } from '../runtime/runtime.ts';
import { insertArtifacts, type NewArtifact } from '../store/artifacts.repository.ts';
import { isDatabaseUnavailable, type Database, type Db, type ExecutionRow, type ExecutionUpdate, type NewExecutionRow } from '../store/database.ts';
import { insertDlq } from '../store/dlq.repository.ts';
import type { NewRunEvent } from '../store/events.repository.ts';
import { getExecution, insertExecution, settleRunning, updateExecutionIf } from '../store/executions.repository.ts';
import { RunTrace } from '../tracing/run-trace.ts';
import { SPAN } from '../tracing/run-spans.ts';
import { withRunLogContext } from '../tracing/log-context.ts';
import { withSpan } from '../tracing/spans.ts';
import { parseJson, stringifyJson } from '../util/json.ts';
import { classify, type Classification } from './classify.ts';
import { afterFault, type AfterFault, type FaultFacts } from './requeue.ts';
import { EVENTS_CHANNEL, RunEventWriter } from './events.ts';
import { isTerminal } from './status.ts';
import { inputFileArtifacts, loadInputFiles, type InputFile } from './input-files.ts';
import { specOf, type CellRunner, type ExecuteOptions, type SpecRow } from './run-spec.ts';
import { DLQ_ERROR_TYPES, internalClassification, isEngineFailure, TAKEN_OVER_GRACE_MS, TakenOverError } from './outcome.ts';
export { DLQ_ERROR_TYPES, isEngineFailure } from './outcome.ts';
export type { CellRunner } from './run-spec.ts';
export type { ExecutionEvents, RequeueReason } from './outcome.ts';
import type { ExecutionEvents, RequeueReason } from './outcome.ts';

/** Options of {@link Running}. */
export interface RunningOptions {
  db: Db;
  registry: JobTypeRegistry;
  runtime: Runtime;
  guard: RunGuard;
  config: Config;
  logger: Logger;
  clock: Clock;
  workerId: string;
  holders: Holders;
  claims: Claims;
  events?: ExecutionEvents | undefined;
}

/**
 * What a guarded run came to, before it is written. `internal`: the breaker refused it
 * (`service_unavailable`) or the engine failed; `unretryable` when the failure says retrying cannot
 * fix it; `left` when the service stopped and left the run's sandbox running (LeftRunningError).
 */
type Outcome =
  | { kind: 'ran'; raw: RawRun; attempts: number }
  | { kind: 'internal'; type: string; message: string; attempts: number; unretryable?: boolean; left?: boolean }
  | { kind: 'gone' }
  /** Another process took the run over (queue/holders.ts, fencing): nothing is written. */
  | { kind: 'fenced' };

/** Runs held records and settles them. */
export class Running {
  constructor(private readonly o: RunningOptions) {}

  /** Runs a sync submission's row now: takes a worker slot, records, runs, finalizes. */
  async runSync(row: NewExecutionRow, slots: Slots, signal?: AbortSignal, files: InputFile[] = []): Promise<ExecutionRow> {
    await slots.acquire(true, signal);
    let released = false;
    const release = () => {
      if (!released) slots.release();
      released = true;
    };
    const { runtime } = this.o;
    try {
      // Its commit need not wait for the disk: the verdict's commit, before any answer, flushes it too.
      const inserting = insertExecution(this.o.db.kysely, row, { flushLater: true });
      // While the database writes it (the insert is on the wire by the time immediates run), the
      // runtime may get a sandbox ready. Nothing runs before the record exists.
      const hint = runtime.reserve ? setImmediate(() => this.reserve(row, files)) : undefined;
      let inserted: ExecutionRow;
      try {
        inserted = await withSpan(SPAN.admission, { 'sandpod.mode': 'sync', 'sandpod.execution_id': row.id }, () => inserting);
      } finally {
        clearImmediate(hint);
      }
      // The record is held by this process: nobody runs it before its files are written.
      if (files.length > 0) await insertArtifacts(this.o.db.kysely, inputFileArtifacts(inserted.id, files));
      const done = await this.execute(inserted, { release, files });
      // execute() settles every run it can; a record it could not write (database gone) must not be
      // answered as if it were a result.
      if (!isTerminal(done.status)) {
        // Taken over (fenced): the new holder writes the verdict, which is the caller's answer (never a 500).
        if (done.status === 'running' && done.claimed_by !== this.o.workerId) throw new TakenOverError(done.id, (done.timeout_s + done.startup_timeout_s) * 1000 + TAKEN_OVER_GRACE_MS);
        throw new AppError('database_unavailable', `the run's result could not be recorded; execution ${done.id} is left ${done.status} and will be settled by recovery`, { execution_id: done.id });
      }
      return done;
    } finally {
      runtime.unreserve?.(row.id);
      release();
    }
  }

  /** A hint to the runtime; whatever goes wrong in it, the run goes on without. */
  private reserve(row: NewExecutionRow, files: InputFile[]): void {
    try {
      this.o.runtime.reserve?.(this.specOf({ ...row, input_data: parseJson(row.input_data), requirements: JSON.parse(row.requirements) as string[] }, files));
    } catch (err) {
      this.o.logger.warn({ execution_id: row.id, err: errorMessage(err) }, 'could not reserve a sandbox; the run starts without one');
    }
  }

  /** What the runtime is asked to run for a record (`run-spec.ts`). */
  private specOf(row: SpecRow, files: InputFile[], traceparent?: string): RunSpec {
    return specOf(this.o.config, this.o.registry, row, files, traceparent);
  }

  /**
   * Runs a record this process holds (status `running`, claimed by us) and settles it. `adopt`
   * re-attaches to a run an earlier holder started; `release` is called as soon as the sandbox is gone.
   */
  execute(row: ExecutionRow, opts: ExecuteOptions = {}): Promise<ExecutionRow> {
    const claimedAt = this.o.clock.now();
    const rt = RunTrace.start(row);
    return withRunLogContext(rt.traceId, () => this.executeTraced(row, opts, rt, claimedAt));
  }

  private async executeTraced(row: ExecutionRow, opts: ExecuteOptions, rt: RunTrace, claimedAt: number): Promise<ExecutionRow> {
    const { holders } = this.o;
    const signal = holders.hold(row.id);
    // Bound here for lines written from callbacks outside the run's async context; the rest of what
    // the run logs (the runtime's lines) gets it from the root logger's mixin (withRunLogContext).
    const log = this.o.logger.child({ execution_id: row.id, correlation_id: row.correlation_id, ...(rt.traceId ? { trace_id: rt.traceId } : {}) });
    let settledRow: ExecutionRow = row;
    let letGo: (() => void) | undefined; // the sandbox holds the outputs until the record is written (RunOptions.holdRelease)
    this.o.events?.onStarted?.(row);
    // GET /jobs/{id}/events: phases and output, written while this process holds the run.
    const events = new RunEventWriter({ db: this.o.db, executionId: row.id, maxBytes: this.o.config.max_stdout_bytes, clock: this.o.clock, logger: log });
    let lastEvents: NewRunEvent[] = [];
    try {
      if (row.cancel_requested) holders.abort(row.id, 'cancel');
      // A queued run was taken: `starting`, with how long it waited. A sync run's stream already
      // opens with `starting` (its creation, event 0). Adopted: what the earlier holder stored is not
      // stored again.
      if (opts.adopt) await events.resume();
      else if (row.mode !== 'sync') events.status('running', 'starting', row.created_at);
      const progress = { userCodeStarted: false };
      const files = opts.files ?? (row.input_files > 0 ? await loadInputFiles(this.o.db.kysely, row.id) : []);
      const outcome = await this.runGuarded(row, files, signal, opts.adopt ?? false, log, events, progress, rt.traceparent, opts.runner);
      rt.stages(outcome.kind === 'ran' ? outcome.raw : null, { createdAt: new Date(row.created_at).getTime(), claimedAt, returnedAt: this.o.clock.now() });
      // The sandbox is gone: its worker slot can serve the next job while this one is recorded.
      opts.release?.();
      if (outcome.kind === 'fenced' || (signal.aborted && signal.reason === 'fenced')) {
        // Its new holder resumes the events and writes the verdict; what is pending here is dropped.
        await events.closeForSettle();
        log.warn({ phase: row.phase }, 'attempt stopped: the run was taken over by another process; its result is not recorded here');
        return (await getExecution(this.o.db.kysely, row.id)) ?? row;
      }
      holders.finishing(row.id);
      letGo = outcome.kind === 'ran' ? outcome.raw.letGo : undefined;
      if (outcome.kind === 'gone') {
        await events.close();
        return await this.whileUnavailable(signal, log, () => this.settleGone(row, log));
      }
      if (signal.aborted && signal.reason === 'shutdown' && row.mode === 'async') {
        events.status('queued', 'queued');
        await events.close();
        // Left running (a Kubernetes Job): the next holder re-attaches to it; otherwise it starts again.
        return await this.requeue(row, 'shutdown', `service shut down during the run${outcome.kind === 'internal' && outcome.left ? '; its pod is left running for the next holder' : ''}`);
      }
      const decision = this.afterFault(row, outcome, progress.userCodeStarted, signal);
      if (decision.action === 'requeue') {
        events.status('queued', 'queued');
        await events.close();
        const runAfter = new Date(this.o.clock.now() + decision.delayMs);
        const open = outcome.kind === 'internal' && outcome.type === 'service_unavailable' && outcome.attempts === 0;
        const why = open ? 'the circuit breaker is open' : 'the machinery failed before user code started';
        return await this.whileUnavailable(signal, log, () => this.requeue(row, open ? 'breaker_open' : 'infra_failure', why, { runAfter, infraFailures: decision.infraFailures }));
      }
      if (outcome.kind === 'ran') {
        if (outcome.raw.stdoutTruncated) events.markTruncated('stdout');
        if (outcome.raw.stderrTruncated) events.markTruncated('stderr');
      }
      // Stored with the verdict (what is still pending) or before it (what was written already): a
      // reader that sees the record terminal has all output.
      lastEvents = await events.closeForSettle();
      const settling = this.o.clock.now();
      settledRow = await this.whileUnavailable(signal, log, () => this.finalize(row, outcome, log, lastEvents, decision.failedBeforeStart));
      rt.settled(settling, this.o.clock.now(), settledRow.status);
      return settledRow;
    } catch (err) {
      letGo = undefined; // not written here: whoever settles it may need the outputs
      log.error({ err }, 'finalizing a run failed');
      return await this.finalize(row, { kind: 'internal', type: 'internal_error', message: `internal error: ${errorMessage(err)}`, attempts: 1 }, log, lastEvents).catch(() => row);
    } finally {
      await events.close().catch(() => {});
      holders.release(row.id);
      letGo?.();
      rt.end(settledRow.status, (settledRow.error as { type?: string } | null)?.type);
    }
  }

  /**
   * Retries `write` while the database is unreachable (restart, outage): the run is over and its
   * verdict exists only in this process, so it is kept and written once the database is back. The
   * record stays held (heartbeats resume with the database). Gives up at shutdown (the holder's
   * signal aborts with `shutdown`): the record is left `running` under this dead process and the next
   * sweep settles it.
   */
  private async whileUnavailable<T>(signal: AbortSignal, log: Logger, write: () => Promise<T>): Promise<T> {
    for (let delay = 100, warned = false; ; delay = Math.min(delay * 2, 2000)) {
      try {
        return await write();
      } catch (err) {
        if (!isDatabaseUnavailable(err) || (signal.aborted && (signal.reason === 'shutdown' || signal.reason === 'fenced'))) throw err;
        if (!warned) log.warn({ err: errorMessage(err) }, 'database unavailable; keeping the result until it is back');
        warned = true;
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  /** Requeue or settle after a run the machinery may have failed (`requeue.ts`). */
  private afterFault(row: ExecutionRow, outcome: Exclude<Outcome, { kind: 'gone' | 'fenced' }>, started: boolean, signal: AbortSignal): AfterFault {
    // Started here, or (an adopted run) by the process that held it before.
    const userCodeStarted = started || row.phase === 'execution' || (outcome.kind === 'ran' && outcome.raw.observation.phase !== 'startup');
    let kind: FaultFacts['kind'] = 'other';
    if (signal.aborted) kind = 'other';
    else if (outcome.kind === 'internal') kind = outcome.type === 'service_unavailable' ? 'rejected' : outcome.unretryable ? 'other' : 'engine';
    else if (isEngineFailure(outcome.raw)) kind = 'engine';
    return afterFault({
      mode: row.mode,
      kind,
      engineCalls: outcome.attempts,
      userCodeStarted,
      infraFailures: row.infra_failures,
      breakerRetryInMs: this.o.guard.breaker.retryInMs(),
    });
  }

  /** One run through the guard: breaker open → `service_unavailable`; engine failures retried. */
  private async runGuarded(row: ExecutionRow, files: InputFile[], signal: AbortSignal, adopt: boolean, log: Logger, events: RunEventWriter, progress: { userCodeStarted: boolean }, traceparent: string | undefined, runner?: CellRunner): Promise<Outcome> {
    const { runtime, db, workerId } = this.o;
    const spec = this.specOf(row, files, traceparent);
    const jt = spec.jobType;
    log.info(
      { job_type: jt.name, mode: row.mode, requirements: spec.requirements.length, ...(adopt ? { adopted: true } : {}) },
      spec.requirements.length > 0 ? 'run starting; installing requirements first' : 'run starting',
    );
    // The phase only matters to crash recovery of async runs (re-queue before user code started).
    const onPhase = (phase: 'startup' | 'installing' | 'execution') => {
      if (phase === 'installing') {
        log.info({ requirements: spec.requirements }, 'installing requirements');
        events.status('running', 'installing');
      }
      if (phase === 'execution') {
        progress.userCodeStarted = true;
        log.info('program started');
        events.status('running', 'running');
      }
      if (phase === 'execution' && row.mode === 'async') void updateExecutionIf(db.kysely, row.id, ['running'], { phase }, workerId).catch(() => {});
    };
    const onOutput = (stream: 'stdout' | 'stderr', chunk: Uint8Array) => events.output(stream, chunk);
    const confirmHeld = () => this.o.holders.confirmHeld(row.id);
    const res = await this.o.guard.run(() => (runner ?? runtime.run.bind(runtime))(spec, { signal, onPhase, onOutput, adopt, confirmHeld, holdRelease: true, leaveOnShutdown: row.mode === 'async', earlierAttempts: row.attempts > 1 }), {
      isEngineFailure,
      // Nothing to re-attach to says nothing about the engine: a restart adopting many lost runs must
      // not open the circuit for everyone.
      isNeutral: (err) => err instanceof RunGoneError || err instanceof FencedError || err instanceof LeftRunningError,
      // Never once the program started: a retry would run it a second time.
      retryable: () => !signal.aborted && !progress.userCodeStarted,
      onRetry: (n, err, delay) => log.warn({ attempt: n, delay_ms: delay, err: errorMessage(err) }, 'engine failure; retrying'),
    });
    if (res.kind === 'ok') return { kind: 'ran', raw: res.value, attempts: res.attempts };
    if (res.kind === 'rejected') {
      const last = res.lastFailure === undefined ? '' : `; the last attempt failed: ${errorMessage(res.lastFailure)}`;
      return { kind: 'internal', type: 'service_unavailable', message: `${res.error.message}${last}`, attempts: res.attempts };
    }
    if (res.error instanceof RunGoneError) {
      // Adopted, and nothing of the program ran (it never reached a pod): started afresh here. A sync
      // run's client waits on another replica, which cannot start it again itself.
      if (adopt && res.error.neverStarted) {
        log.warn({ err: errorMessage(res.error) }, 'adopted run never started; starting it afresh');
        return this.runGuarded(row, files, signal, false, log, events, progress, traceparent, runner);
      }
      return { kind: 'gone' };
    }
    if (res.error instanceof FencedError) return { kind: 'fenced' };
    if (res.error instanceof LeftRunningError) return { kind: 'internal', type: 'internal_error', message: res.error.message, attempts: res.attempts, left: true };
    log.error({ err: res.error, attempts: res.attempts }, 'engine failed');
    return {
      kind: 'internal',
      type: 'internal_error',
      message: `sandbox engine failed after ${res.attempts} attempt(s): ${errorMessage(res.error)}`,
      attempts: res.attempts,
      unretryable: res.error instanceof UnretryableError,
    };
  }

  /** Writes the verdict once (guarded on status `running` and our claim), with artifacts and DLQ. */
  private async finalize(row: ExecutionRow, outcome: Exclude<Outcome, { kind: 'gone' | 'fenced' }>, log: Logger, lastEvents: NewRunEvent[] = [], failedBeforeStart = false): Promise<ExecutionRow> {
    const { db, workerId } = this.o;
    const now = new Date(this.o.clock.now());
    const raw = outcome.kind === 'ran' ? outcome.raw : null;
    const c: Classification = outcome.kind === 'ran' ? classify(outcome.raw) : internalClassification(outcome.type, outcome.message);
    const startedAt = raw?.observation.startedAt ?? row.started_at ?? now;
    const endedAt = raw?.observation.endedAt ?? now;
    const patch: ExecutionUpdate = {
      status: c.status,
      exit_code: c.exitCode,
      error: c.error ? JSON.stringify(c.error) : null,
      output: c.output === null || c.output === undefined ? null : stringifyJson(c.output),
      stdout: JSON.stringify(raw?.stdout ?? ''),
      stderr: JSON.stringify(raw?.stderr ?? ''),
      stdout_truncated: raw?.stdoutTruncated ?? false,
      stderr_truncated: raw?.stderrTruncated ?? false,
      artifacts_total: raw ? (raw.artifactsTotal ?? raw.artifacts.length) : 0,
      artifacts_truncated: raw?.artifactsTruncated ?? false,
      timing: JSON.stringify(c.timing),
      resource_usage: JSON.stringify(c.resourceUsage),
      started_at: startedAt,
      ended_at: endedAt,
      duration_ms: Math.max(0, Math.round(new Date(endedAt).getTime() - new Date(startedAt).getTime())),
      phase: c.timing.phase_at_exit,
      claimed_by: null,
      // Its idempotency key may be submitted again (the job failed for the machinery, its code never ran).
      failed_before_start: failedBeforeStart && c.status === 'failed',
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
    const dlqError = c.error !== null && DLQ_ERROR_TYPES.has(c.error.type) ? c.error : null;
    const settle = (q: Kysely<Database> | Transaction<Database>) => settleRunning(q, row.id, workerId, patch, DONE_CHANNEL, { list: lastEvents, channel: EVENTS_CHANNEL });
    // The common case (no files, no DLQ entry) is one statement; otherwise one short transaction.
    const updated =
      artifacts.length === 0 && !dlqError
        ? await settle(db.kysely)
        : await db.kysely.transaction().execute(async (tx) => {
            const u = await settle(tx);
            if (!u) return undefined;
            await insertArtifacts(tx, artifacts);
            if (dlqError) {
              await insertDlq(tx, {
                jobId: row.id,
                jobData: { code: row.code, input_data: row.input_data, job_type: row.job_type, timeout: row.timeout_s, startup_timeout: row.startup_timeout_s, requirements: row.requirements },
                errorType: dlqError.type,
                errorMessage: dlqError.message,
                retryCount: Math.max(0, outcome.attempts - 1),
                clientIp: row.client_ip,
                correlationId: row.correlation_id,
              });
            }
            return u;
          });
    if (!updated) {
      // Someone else settled it (a cancel of a queued row cannot reach here; another process adopted it).
      log.warn('record was settled elsewhere; result dropped');
      return (await getExecution(db.kysely, row.id)) ?? row;
    }
    this.o.events?.onFinished?.(updated);
    log.info({ status: updated.status, error_type: c.error?.type, duration_ms: updated.duration_ms }, 'run finished');
    return updated;
  }

  private async requeue(row: ExecutionRow, reason: RequeueReason, why: string, g: GiveBack = {}): Promise<ExecutionRow> {
    const u = await this.o.claims.giveBack(row, g);
    if (u.status === 'queued') this.o.events?.onRequeued?.(u, reason);
    this.o.logger.info({ execution_id: row.id, why, ...(g.runAfter ? { run_after: g.runAfter.toISOString(), infra_failures: g.infraFailures } : {}) }, 'job returned to the queue');
    return u;
  }

  /**
   * A run that left nothing to re-attach to (after a crash): async runs that never reached user code
   * go back to the queue; the others fail with `internal_error` and land in the DLQ.
   */
  private async settleGone(row: ExecutionRow, log: Logger): Promise<ExecutionRow> {
    if (row.mode === 'async' && (row.phase === 'startup' || row.phase === null)) return this.requeue(row, 'crash', 'its process died before user code started');
    const message = 'the service stopped while this job was running (user code may have started); it was not re-run';
    return this.finalize(row, { kind: 'internal', type: 'internal_error', message, attempts: row.attempts }, log);
  }
}
