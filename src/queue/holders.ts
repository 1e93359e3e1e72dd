/**
 * Holding runs: which running records this process holds, their heartbeats, cancellation fan-out
 * across processes, and taking over the runs of holders that died.
 *
 * A cancel reaches the holder of a running record two ways, each enough on its own: a NOTIFY on
 * {@link CANCEL_CHANNEL} (prompt), and the `cancel_requested` flag that every heartbeat reads back
 * (within one period, for a NOTIFY lost to a dropped listener connection). A holder whose heartbeat is
 * five periods old, or a process of this host that no longer exists, is dead: the periodic sweep adopts
 * its runs and hands them to the running module.
 */
import { hostname } from 'node:os';
import type { Clock } from '../clock.ts';
import { errorMessage } from '../errors.ts';
import type { Logger } from '../logger.ts';
import type { Db, ExecutionRow } from '../store/database.ts';
import { updateExecutionIf, type Q } from '../store/executions.repository.ts';
import { CANCEL_CHANNEL } from './channels.ts';

/** Why a held run is aborted: a user's cancel, or this process shutting down. */
export type AbortReason = 'cancel' | 'shutdown';

/** A holder silent for this many heartbeat periods is presumed dead. */
export const STALE_HEARTBEATS = 5;

/**
 * Refreshes the heartbeat of the records `worker` holds; returns those whose cancellation was
 * requested (by any process), in the same round trip.
 */
export async function heartbeat(db: Q, worker: string, ids: string[], now: Date): Promise<string[]> {
  if (ids.length === 0) return [];
  const rows = await db
    .updateTable('executions')
    .set({ heartbeat_at: now })
    .where('claimed_by', '=', worker)
    .where('id', 'in', ids)
    .where('status', '=', 'running')
    .returning(['id', 'cancel_requested'])
    .execute();
  return rows.filter((r) => r.cancel_requested).map((r) => r.id);
}

/** Who holds each running record not held by `worker`, and when it last heartbeated (no payloads). */
export async function runningHolders(db: Q, worker: string): Promise<{ id: string; claimed_by: string | null; heartbeat_at: Date | null }[]> {
  return db
    .selectFrom('executions')
    .select(['id', 'claimed_by', 'heartbeat_at'])
    .where('status', '=', 'running')
    .where((eb) => eb.or([eb('claimed_by', 'is', null), eb('claimed_by', '!=', worker)]))
    .execute();
}

/** Options of {@link Holders}. */
export interface HoldersOptions {
  db: Db;
  workerId: string;
  clock: Clock;
  logger: Logger;
  /** Heartbeat period; the orphan sweep runs every {@link STALE_HEARTBEATS} periods. */
  heartbeatMs: number;
  /** Runs an adopted orphan (re-attach or settle) and resolves with its final record. */
  onAdopted: (row: ExecutionRow) => Promise<ExecutionRow>;
}

/** The runs this process holds, kept alive and reachable by cancels from any process. */
export class Holders {
  private readonly held = new Map<string, AbortController>();
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private sweepTimer: NodeJS.Timeout | null = null;
  private sweeping = false;
  private unlistenCancel: (() => Promise<void>) | null = null;

  constructor(private readonly o: HoldersOptions) {}

  /** Starts the cancel listener, the heartbeat, and the sweep that adopts runs of dead holders. */
  async start(): Promise<void> {
    this.unlistenCancel = await this.o.db.listen(CANCEL_CHANNEL, (id) => this.abort(id, 'cancel'));
    this.heartbeatTimer = setInterval(() => void this.beat(), this.o.heartbeatMs);
    this.heartbeatTimer.unref();
    this.sweepTimer = setInterval(() => void this.sweep(), this.o.heartbeatMs * STALE_HEARTBEATS);
    this.sweepTimer.unref();
  }

  /** Stops timers and the listener; runs still held are left to {@link abortAll}. */
  async stop(): Promise<void> {
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    this.heartbeatTimer = null;
    this.sweepTimer = null;
    await this.unlistenCancel?.();
    this.unlistenCancel = null;
  }

  /** Registers a run this process now holds; its signal aborts on cancel or shutdown. */
  hold(id: string): AbortSignal {
    const ac = new AbortController();
    this.held.set(id, ac);
    return ac.signal;
  }

  /** Forgets a run (settled, requeued, or dropped). */
  release(id: string): void {
    this.held.delete(id);
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
   * Takes over running records whose holder is dead (stale heartbeat, or a process of this host that
   * no longer exists) and hands each to `onAdopted`. Returns their completion promises.
   */
  async recoverOrphans(): Promise<Promise<ExecutionRow>[]> {
    const { db, workerId, clock, heartbeatMs } = this.o;
    const staleBefore = clock.now() - heartbeatMs * STALE_HEARTBEATS;
    const out: Promise<ExecutionRow>[] = [];
    for (const r of await runningHolders(db.kysely, workerId)) {
      const stale = r.heartbeat_at === null || new Date(r.heartbeat_at).getTime() < staleBefore;
      if (!stale && !holderIsDeadHere(r.claimed_by)) continue;
      // Conditional on the old holder: of two sweepers, one adopts.
      const adopted = await updateExecutionIf(db.kysely, r.id, ['running'], { claimed_by: workerId, heartbeat_at: new Date(clock.now()) }, r.claimed_by ?? undefined);
      if (!adopted) continue;
      this.o.logger.warn({ execution_id: r.id, previous_holder: r.claimed_by, phase: adopted.phase }, 'adopting an orphaned run');
      out.push(this.o.onAdopted(adopted));
    }
    return out;
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

  private async beat(): Promise<void> {
    const ids = [...this.held.keys()];
    if (ids.length === 0) return;
    try {
      for (const id of await heartbeat(this.o.db.kysely, this.o.workerId, ids, new Date(this.o.clock.now()))) this.abort(id, 'cancel');
    } catch (err) {
      this.o.logger.warn({ err: errorMessage(err) }, 'heartbeat failed');
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
