/**
 * The record lifecycle's facade (SPEC §3): one object for the API and main.ts that composes the parts —
 * submission (`submission.ts`), running and settling (`running.ts`), cancellation (`cancel.ts`), and
 * the queue's claims and holders (`src/queue/`). It holds no logic of its own beyond the wiring.
 * Knows nothing of HTTP.
 */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { systemClock, type Clock } from '../clock.ts';
import { QueuedNotifier } from '../queue/channels.ts';
import { Claims } from '../queue/claims.ts';
import { Holders, type Every } from '../queue/holders.ts';
import type { Slots } from '../queue/slots.ts';
import { AppError } from '../errors.ts';
import type { ExecutionRow, NewExecutionRow } from '../store/database.ts';
import { SPAN } from '../tracing/run-spans.ts';
import { withSpan } from '../tracing/spans.ts';
import { cancelJob, type SettleWaiter } from './cancel.ts';
import { resolveInputFiles } from './input-files.ts';
import { buildRow, type RequestMeta, type Submission } from './requests.ts';
import { Running, type CellRunner, type RunningOptions } from './running.ts';
import { insertExecution } from '../store/executions.repository.ts';
import { Submissions, type Lineage, type SubmittedJob } from './submission.ts';

export type { ExecutionEvents } from './running.ts';
export type { SubmittedJob } from './submission.ts';

/**
 * Dependencies of {@link Executions}: what its running part needs (the guard is the breaker + retry
 * policy every run attempt goes through), plus the worker slots and the heartbeat period.
 */
export interface ExecutionsOptions extends Pick<RunningOptions, 'db' | 'registry' | 'runtime' | 'guard' | 'config' | 'logger' | 'events'> {
  slots: Slots;
  workerId?: string;
  clock?: Clock;
  /** Heartbeat (and holder lease renewal) period of held runs. */
  heartbeatMs?: number;
  /** Starts the holder's timers (default: setInterval). */
  holderTimers?: Every;
}

/** Record lifecycle service. */
export class Executions {
  /** This process's identity in `claimed_by` (`host/pid/nonce`). */
  readonly workerId: string;
  readonly heartbeatMs: number;
  private readonly clock: Clock;
  private readonly submissions: Submissions;
  private readonly claims: Claims;
  private readonly holders: Holders;
  private readonly running: Running;
  private draining = false;
  /** Sync runs in flight: a drain waits for them as for the dispatcher's runs. */
  private readonly syncRuns = new Set<Promise<unknown>>();

  constructor(private readonly o: ExecutionsOptions) {
    const { db, logger } = o;
    this.clock = o.clock ?? systemClock;
    this.workerId = o.workerId ?? `${hostname()}/${process.pid}/${randomBytes(4).toString('hex')}`;
    this.heartbeatMs = o.heartbeatMs ?? 2000;
    const notifier = new QueuedNotifier(db);
    const clock = this.clock;
    const workerId = this.workerId;
    this.submissions = new Submissions({ db, registry: o.registry, config: o.config, clock, notifier });
    this.claims = new Claims({ db, workerId, clock, notifier });
    this.holders = new Holders({ db, workerId, clock, logger, heartbeatMs: this.heartbeatMs, leaseMs: o.config.holder_lease_seconds * 1000, ...(o.holderTimers ? { every: o.holderTimers } : {}), onAdopted: (row) => this.running.execute(row, { adopt: true }) });
    this.running = new Running({ ...o, clock, workerId, holders: this.holders, claims: this.claims, events: o.events });
  }

  /** Starts heartbeats, the cross-process cancel listener, and the sweep for runs of dead holders. */
  start(): Promise<void> {
    return this.holders.start();
  }

  /** Stops listeners and timers; runs still held are left to {@link abortAll}. */
  stop(): Promise<void> {
    return this.holders.stop();
  }

  /** Aborts every held run (shutdown): async runs go back to the queue, sync ones fail. */
  abortAll(): void {
    this.holders.abortAll('shutdown');
  }

  /**
   * Starts a drain (SIGTERM): from now on every new submission — sync, async, rerun, fork — is
   * refused with `shutting_down` (503); work already accepted goes on.
   */
  beginDrain(): void {
    this.draining = true;
  }

  /** Whether {@link beginDrain} was called. */
  get isDraining(): boolean {
    return this.draining;
  }

  /** Resolves true when every sync run in flight has ended, false when `ms` passes first. */
  async syncSettled(ms: number): Promise<boolean> {
    if (this.syncRuns.size === 0) return true;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<false>((r) => (timer = setTimeout(() => r(false), Math.max(0, ms))));
    const done = Promise.allSettled([...this.syncRuns]).then(() => true as const);
    const ok = await Promise.race([done, timeout]);
    clearTimeout(timer);
    return ok;
  }

  private refuseWhileDraining(): void {
    if (this.draining) throw new AppError('shutting_down', 'service is shutting down; retry on another instance');
  }

  /** Runs a submission synchronously: takes a worker slot, records, runs, finalizes. */
  runSync(s: Submission, meta: RequestMeta, signal?: AbortSignal): Promise<ExecutionRow> {
    this.refuseWhileDraining();
    const p = this.startSync(s, meta, signal);
    const tracked = p.catch(() => {}).finally(() => this.syncRuns.delete(tracked));
    this.syncRuns.add(tracked);
    return p;
  }

  private async startSync(s: Submission, meta: RequestMeta, signal?: AbortSignal): Promise<ExecutionRow> {
    // Only a submission with files waits for anything before its record is built.
    const files = s.files ?? (s.input_files || s.input_artifacts?.length ? await resolveInputFiles(this.o.db.kysely, this.o.config, s.input_files, s.input_artifacts) : []);
    const row = buildRow(this.o.config, this.o.registry, { ...s, files }, { mode: 'sync', status: 'running', meta, workerId: this.workerId, now: new Date(this.clock.now()) });
    return this.running.runSync(row, this.o.slots, signal, files);
  }

  /**
   * Records and runs a session's cell (issue 19): `row` is a built record (mode sync, running, held by
   * this process) and `runner` runs it in the session's sandbox. Settled like any run: classified,
   * artifacts, events, DLQ.
   */
  async runCell(row: NewExecutionRow, runner: CellRunner): Promise<ExecutionRow> {
    this.refuseWhileDraining();
    const inserted = await insertExecution(this.o.db.kysely, row);
    return this.running.execute(inserted, { runner });
  }

  /**
   * Queues a submission (SPEC §4.2). With an idempotency key: the same payload returns the existing
   * job; a different payload is a 409 naming it.
   */
  async submitAsync(s: Submission, meta: RequestMeta, lineage?: Lineage): Promise<{ row: SubmittedJob; created: boolean }> {
    this.refuseWhileDraining();
    return withSpan(SPAN.admission, { 'sandpod.mode': 'async', 'sandpod.job_type': s.job_type }, () => this.submissions.submit(s, meta, lineage));
  }

  /** Re-runs a finished job with the same code, input, job type and settings (SPEC §4.6). */
  async rerun(id: string, meta: RequestMeta, callbackUrl?: string | null): Promise<SubmittedJob> {
    this.refuseWhileDraining();
    return withSpan(SPAN.admission, { 'sandpod.mode': 'async', 'sandpod.relationship': 'rerun' }, () => this.submissions.rerun(id, meta, callbackUrl));
  }

  /** Forks a finished job: new code, the original input, job type and settings (SPEC §4.7). */
  async fork(id: string, code: string, meta: RequestMeta, callbackUrl?: string | null): Promise<SubmittedJob> {
    this.refuseWhileDraining();
    return withSpan(SPAN.admission, { 'sandpod.mode': 'async', 'sandpod.relationship': 'fork' }, () => this.submissions.fork(id, code, meta, callbackUrl));
  }

  /**
   * Cancels a job (SPEC §4.5). Queued: cancelled at once. Running: the holder (this process or
   * another) kills the sandbox; waits up to `waitMs` for the record to settle. Already cancelled:
   * returned as is. Otherwise finished: 409.
   */
  cancel(id: string, waitMs = 10_000, waitFor?: SettleWaiter): Promise<ExecutionRow> {
    return cancelJob({ db: this.o.db, holders: this.holders, clock: this.clock, events: this.o.events }, id, waitMs, waitFor);
  }

  /** Claims the oldest queued job for this process, or undefined (the dispatcher's source). */
  claim(): Promise<ExecutionRow | undefined> {
    return this.claims.claim();
  }

  /** Runs a record this process holds and settles it (the dispatcher's sink). */
  execute(row: ExecutionRow, opts: { adopt?: boolean; release?: () => void } = {}): Promise<ExecutionRow> {
    return this.running.execute(row, opts);
  }

  /** Adopts and settles runs whose holder died; returns their completion promises. */
  recoverOrphans(): Promise<Promise<ExecutionRow>[]> {
    return this.holders.recoverOrphans();
  }
}
