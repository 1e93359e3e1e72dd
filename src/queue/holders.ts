/**
 * Holding runs: which running records this process holds, their heartbeats, its liveness lease,
 * cancellation fan-out across processes, taking over the runs of holders that died, and fencing.
 *
 * A cancel reaches the holder of a running record two ways, each enough on its own: a NOTIFY on
 * {@link CANCEL_CHANNEL} (prompt), and the `cancel_requested` flag that every heartbeat reads back
 * (within one period, for a NOTIFY lost to a dropped listener connection).
 *
 * Liveness (leases.ts): each heartbeat period the process renews its lease to the database's
 * `now()` + `leaseMs`. A holder is dead only when its lease has expired by the database's clock, or it
 * is a process of this host that no longer exists; the periodic sweep then takes its runs over and
 * hands them to the running module. Fencing: a holder whose heartbeat finds a run of its own held by
 * another process (or settled by one) aborts that attempt at once with reason `fenced` (the runtime
 * lets go of the sandbox without settling or starting anything), and {@link Holders.confirmHeld}
 * lets the runtime ask, before each step that would start the program, whether the run is still ours.
 */
import { performance } from 'node:perf_hooks';
import { hostname } from 'node:os';
import type { Clock } from '../clock.ts';
import { errorMessage } from '../errors.ts';
import type { Logger } from '../logger.ts';
import type { Db, ExecutionRow } from '../store/database.ts';
import { updateExecutionIf, type Q } from '../store/executions.repository.ts';
import { CANCEL_CHANNEL } from './channels.ts';
import { dropOldLeases, expireLease, heldElsewhere, holdersOf, judgeHolder, renewLease, takeFromExpired, type HolderVerdict } from './leases.ts';

/** Why a held run is aborted: a user's cancel, this process shutting down, or its run taken over elsewhere. */
export type AbortReason = 'cancel' | 'shutdown' | 'fenced';

/** The orphan sweep runs every this many heartbeat periods. */
export const SWEEP_HEARTBEATS = 5;

/** Default lease duration: how long a silent holder keeps its runs, ms (`holder_lease_seconds`). */
export const DEFAULT_LEASE_MS = 30_000;

/**
 * Refreshes the heartbeat of the records `worker` holds; returns the ids it still holds (the others
 * were settled or taken over) and those whose cancellation was requested, in the same round trip.
 */
export async function heartbeat(db: Q, worker: string, ids: string[], now: Date): Promise<{ held: Set<string>; cancel: string[] }> {
  if (ids.length === 0) return { held: new Set(), cancel: [] };
  const rows = await db
    .updateTable('executions')
    .set({ heartbeat_at: now })
    .where('claimed_by', '=', worker)
    .where('id', 'in', ids)
    .where('status', '=', 'running')
    .returning(['id', 'cancel_requested'])
    .execute();
  return { held: new Set(rows.map((r) => r.id)), cancel: rows.filter((r) => r.cancel_requested).map((r) => r.id) };
}

/** Starts `fn` every `ms`; returns the function that stops it (tests pass their own to stall a holder). */
export type Every = (ms: number, fn: () => void) => () => void;

const realEvery: Every = (ms, fn) => {
  const t = setInterval(fn, ms);
  t.unref();
  return () => clearInterval(t);
};

/** Options of {@link Holders}. */
export interface HoldersOptions {
  db: Db;
  workerId: string;
  clock: Clock;
  logger: Logger;
  /** Heartbeat (and lease renewal) period; the orphan sweep runs every {@link SWEEP_HEARTBEATS} periods. */
  heartbeatMs: number;
  /** Lease duration, ms (default {@link DEFAULT_LEASE_MS}): a holder silent this long is presumed dead. */
  leaseMs?: number;
  /** Runs an adopted orphan (re-attach or settle) and resolves with its final record. */
  onAdopted: (row: ExecutionRow) => Promise<ExecutionRow>;
  every?: Every;
}

/** The runs this process holds, kept alive and reachable by cancels from any process. */
export class Holders {
  private readonly held = new Map<string, AbortController>();
  /** Runs whose outcome this process is writing: their record leaving `running` is our own doing. */
  private readonly finishingIds = new Set<string>();
  private stopTimers: (() => void)[] = [];
  private sweeping = false;
  private beating: Promise<void> | null = null;
  private unlistenCancel: (() => Promise<void>) | null = null;
  readonly leaseMs: number;
  /**
   * Until when (performance.now(), ms) our lease is surely valid: the send time of the last renewal
   * that succeeded plus the lease, less a margin. Before then nobody can have taken our runs.
   */
  private leaseSureUntil = Number.NEGATIVE_INFINITY;

  constructor(private readonly o: HoldersOptions) {
    this.leaseMs = o.leaseMs ?? DEFAULT_LEASE_MS;
  }

  /** Takes the lease, starts the cancel listener, the heartbeat, and the sweep that adopts runs of dead holders. */
  async start(): Promise<void> {
    await this.renew();
    this.unlistenCancel = await this.o.db.listen(CANCEL_CHANNEL, (id) => this.abort(id, 'cancel'));
    const every = this.o.every ?? realEvery;
    this.stopTimers = [every(this.o.heartbeatMs, () => void this.beat()), every(this.o.heartbeatMs * SWEEP_HEARTBEATS, () => void this.sweep())];
  }

  /** Stops timers and the listener and ends the lease; runs still held are left to {@link abortAll}. */
  async stop(): Promise<void> {
    for (const stop of this.stopTimers) stop();
    this.stopTimers = [];
    await this.unlistenCancel?.();
    this.unlistenCancel = null;
    // What this process leaves running is taken over at the next sweep, not a lease later.
    await expireLease(this.o.db.kysely, this.o.workerId).catch(() => undefined);
    this.leaseSureUntil = Number.NEGATIVE_INFINITY;
  }

  /** Registers a run this process now holds; its signal aborts on cancel, shutdown or fencing. */
  hold(id: string): AbortSignal {
    const ac = new AbortController();
    this.held.set(id, ac);
    this.finishingIds.delete(id);
    return ac.signal;
  }

  /** Forgets a run (settled, requeued, or dropped). */
  release(id: string): void {
    this.held.delete(id);
    this.finishingIds.delete(id);
  }

  /** This process is writing the run's outcome (settling or giving it back): its record leaving `running` is expected. */
  finishing(id: string): void {
    if (this.held.has(id)) this.finishingIds.add(id);
  }

  /** Aborts a run held here; false when this process does not hold it. */
  abort(id: string, reason: AbortReason): boolean {
    const ac = this.held.get(id);
    if (!ac) return false;
    if (!ac.signal.aborted) ac.abort(reason);
    return true;
  }

  /** Aborts every held run (shutdown). */
  abortAll(reason: AbortReason): void {
    for (const id of this.held.keys()) this.abort(id, reason);
  }

  /**
   * Whether the run is still this process's to run, asked by the runtime before a step that would
   * start the program (a Job's create, a hand-over). Answered from memory while the lease is surely
   * valid; otherwise after a renewal and a heartbeat (which fence what was taken over). Throws when
   * the database cannot say (the lease could not be renewed): not knowing is not being fenced, and
   * the attempt fails like any engine call that could not be made (the guard retries it).
   */
  async confirmHeld(id: string): Promise<boolean> {
    const held = () => {
      const ac = this.held.get(id);
      return !!ac && !(ac.signal.aborted && ac.signal.reason === 'fenced');
    };
    if (!held()) return false;
    if (performance.now() < this.leaseSureUntil) return true;
    await this.beat();
    if (!held()) return false;
    if (performance.now() < this.leaseSureUntil) return true;
    throw new Error('could not confirm that the run is still this process’s: its holder lease could not be renewed (database unavailable?)');
  }

  /**
   * Asks the holder of a running record, wherever it is, to stop it: flags the record (read back by
   * the holder's heartbeat), then aborts it here or NOTIFYs the other processes. False when the record
   * is not running any more.
   */
  async requestCancel(id: string): Promise<boolean> {
    const flagged = await updateExecutionIf(this.o.db.kysely, id, ['running'], { cancel_requested: true });
    if (!flagged) return false;
    if (!this.abort(id, 'cancel')) await this.o.db.notify(CANCEL_CHANNEL, id);
    return true;
  }

  /**
   * Takes over running records whose holder is dead (its lease expired by the database's clock, or
   * a process of this host that no longer exists; see leases.ts `judgeHolder`) and hands each to
   * `onAdopted`. Returns their completion promises.
   */
  async recoverOrphans(): Promise<Promise<ExecutionRow>[]> {
    const { db, workerId, clock } = this.o;
    const rows = await heldElsewhere(db.kysely, workerId);
    const deadHere = new Map<string | null, boolean>();
    const expired = new Map<string, string[]>();
    const taken: { row: ExecutionRow; previous: string | null; why: HolderVerdict }[] = [];
    for (const r of rows) {
      if (!deadHere.has(r.claimed_by)) deadHere.set(r.claimed_by, holderIsDeadHere(r.claimed_by));
      const why = judgeHolder({ holder: r.claimed_by, leaseExpiresAt: r.expires_at, heartbeatAt: r.heartbeat_at, dbNow: r.db_now, deadHere: deadHere.get(r.claimed_by)! }, this.leaseMs);
      if (why === 'alive') continue;
      if (why === 'lease_expired') {
        expired.set(r.claimed_by!, [...(expired.get(r.claimed_by!) ?? []), r.id]);
        continue;
      }
      // Conditional on the old holder: of two sweepers, one adopts.
      const adopted = await updateExecutionIf(db.kysely, r.id, ['running'], { claimed_by: workerId, heartbeat_at: new Date(clock.now()) }, r.claimed_by ?? undefined);
      if (adopted) taken.push({ row: adopted, previous: r.claimed_by, why });
    }
    for (const [holder, ids] of expired) {
      for (const row of await takeFromExpired(db, holder, ids, workerId, new Date(clock.now()))) taken.push({ row, previous: holder, why: 'lease_expired' });
    }
    const out: Promise<ExecutionRow>[] = [];
    for (const { row, previous, why } of taken) {
      this.o.logger.warn({ execution_id: row.id, previous_holder: previous, holder_dead: why, phase: row.phase }, 'adopting an orphaned run');
      out.push(this.o.onAdopted(row));
    }
    return out;
  }

  private async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      await this.recoverOrphans();
      await dropOldLeases(this.o.db.kysely);
    } catch (err) {
      this.o.logger.warn({ err: errorMessage(err) }, 'orphan sweep failed');
    } finally {
      this.sweeping = false;
    }
  }

  /** Renews the lease; true when it had lapsed (runs may have been taken over meanwhile). */
  private async renew(): Promise<boolean> {
    const sentAt = performance.now();
    const { lapsed } = await renewLease(this.o.db.kysely, this.o.workerId, this.leaseMs);
    // A margin for the database's clock running a little faster than ours between two renewals.
    this.leaseSureUntil = sentAt + this.leaseMs * 0.9;
    if (lapsed) this.o.logger.warn({ worker: this.o.workerId, lease_ms: this.leaseMs }, 'this process was silent longer than its lease; runs taken over meanwhile are given up');
    return lapsed;
  }

  /** One heartbeat: the lease, then the held runs (one at a time: a second caller waits for this one). */
  private beat(): Promise<void> {
    this.beating ??= this.beatOnce().finally(() => (this.beating = null));
    return this.beating;
  }

  private async beatOnce(): Promise<void> {
    try {
      await this.renew();
      const ids = [...this.held.keys()];
      if (ids.length === 0) return;
      const { held, cancel } = await heartbeat(this.o.db.kysely, this.o.workerId, ids, new Date(this.o.clock.now()));
      for (const id of cancel) this.abort(id, 'cancel');
      const lost = ids.filter((id) => !held.has(id) && this.held.has(id) && !this.finishingIds.has(id));
      if (lost.length > 0) await this.fence(lost);
    } catch (err) {
      this.o.logger.warn({ err: errorMessage(err) }, 'heartbeat failed');
    }
  }

  /** Stops the attempts of runs this process no longer holds (taken over, or settled by another process). */
  private async fence(ids: string[]): Promise<void> {
    const now = await holdersOf(this.o.db.kysely, ids);
    for (const id of ids) {
      const cur = now.get(id);
      // Between the heartbeat and this read our own outcome may have been written: not a takeover.
      if (!this.held.has(id) || this.finishingIds.has(id) || cur?.claimed_by === this.o.workerId) continue;
      this.o.logger.warn(
        { execution_id: id, holder: cur?.claimed_by ?? null, status: cur?.status ?? 'missing' },
        'run taken over by another process; stopping this attempt without settling it',
      );
      this.abort(id, 'fenced');
    }
  }
}

/** True when `holder` (`host/pid/nonce`) names a process of this host that is not running any more. */
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
