/**
 * The dispatcher: fills free worker slots with queued jobs. Claims happen in the database
 * (`FOR UPDATE SKIP LOCKED`), so several processes share one queue without running a job twice.
 * Wakes on NOTIFY of new work and on a slow poll as a fallback for a lost notification. A gate (the
 * circuit breaker's state, see {@link dispatchGate}) can hold claims back: while the engine is known
 * to be failing, queued work stays queued instead of being claimed only to fail.
 */
import type { Logger } from '../logger.ts';
import type { Slots } from './slots.ts';

/** What the dispatcher needs from the lifecycle service. */
export interface DispatchTarget<Row> {
  claim(): Promise<Row | undefined>;
  /**
   * Runs a claimed row. `release` gives the worker slot back; the target calls it as soon as the
   * sandbox is gone (recording the result needs no slot). The dispatcher calls it too when the
   * promise settles, so forgetting it cannot leak a slot; it acts once.
   */
  execute(row: Row, opts: { release: () => void }): Promise<unknown>;
}

/** Whether the dispatcher may claim now: `go`; `wait` that long first; `probe`: one job at a time. */
export type DispatchGate = { kind: 'go' } | { kind: 'wait'; ms: number } | { kind: 'probe' };

/**
 * The gate for a circuit breaker's state: open → wait until it turns half-open (at least 50 ms, so a
 * clock at the boundary cannot spin); half-open → one job at a time tests the engine; closed → go.
 */
export function dispatchGate(state: 'closed' | 'open' | 'half_open', retryInMs: number): DispatchGate {
  if (state === 'open') return { kind: 'wait', ms: Math.max(50, retryInMs) };
  if (state === 'half_open') return { kind: 'probe' };
  return { kind: 'go' };
}

/** Options of {@link Dispatcher}. */
export interface DispatcherOptions<Row> {
  target: DispatchTarget<Row>;
  slots: Slots;
  logger: Logger;
  /** Subscribes to "work queued" wake-ups; returns an unsubscribe function. */
  subscribe?: (wake: () => void) => Promise<() => Promise<void>>;
  pollMs?: number;
  /** Asked before each claim (default: always `go`). */
  gate?: () => DispatchGate;
}

/** Serves queued jobs with the process's worker slots. */
export class Dispatcher<Row> {
  private stopping = false;
  /** Aborted by {@link stop}: frees a loop waiting for a slot that only a finishing run would give back. */
  private halt = new AbortController();
  private loop: Promise<void> | null = null;
  private wakeUp: (() => void) | null = null;
  private pendingWake = false;
  private unsubscribe: (() => Promise<void>) | null = null;
  private readonly inflight = new Set<Promise<unknown>>();
  /** The job claimed to test the engine while the gate said `probe` (jobs started before do not count). */
  private probing: Promise<unknown> | null = null;
  private readonly pollMs: number;

  constructor(private readonly o: DispatcherOptions<Row>) {
    this.pollMs = o.pollMs ?? 1000;
  }

  /** Starts serving. */
  async start(): Promise<void> {
    this.stopping = false;
    this.halt = new AbortController();
    if (this.o.subscribe) this.unsubscribe = await this.o.subscribe(() => this.wake());
    this.loop = this.run();
  }

  /** Nudges the loop (new work may be queued). */
  wake(): void {
    this.pendingWake = true;
    this.wakeUp?.();
  }

  /** Stops claiming; resolves when in-flight jobs end or `graceMs` passes (then returns false). */
  async stop(graceMs: number): Promise<boolean> {
    this.stopping = true;
    this.halt.abort();
    this.wake();
    await this.unsubscribe?.();
    await this.loop;
    if (this.inflight.size === 0) return true;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<false>((r) => (timer = setTimeout(() => r(false), graceMs)));
    const done = Promise.allSettled([...this.inflight]).then(() => true as const);
    const ok = await Promise.race([done, timeout]);
    clearTimeout(timer);
    return ok;
  }

  /** Waits for every in-flight job (after {@link stop} aborted them). */
  async drained(): Promise<void> {
    await Promise.allSettled([...this.inflight]);
  }

  private async run(): Promise<void> {
    while (!this.stopping) {
      const gate = this.o.gate?.() ?? { kind: 'go' };
      if (gate.kind === 'wait' || (gate.kind === 'probe' && this.probing)) {
        await this.pause(gate.kind === 'wait' ? Math.min(gate.ms, this.pollMs * 5) : Math.min(this.pollMs, 100));
        continue;
      }
      try {
        await this.o.slots.acquire(false, this.halt.signal);
      } catch {
        break; // stopping while every slot is busy: the grace period starts now, not when a run ends
      }
      if (this.stopping) {
        this.o.slots.release();
        break;
      }
      let row: Row | undefined;
      try {
        this.pendingWake = false;
        row = await this.o.target.claim();
      } catch (err) {
        this.o.logger.error({ err }, 'claiming queued work failed');
      }
      if (row === undefined) {
        this.o.slots.release();
        await this.idle();
        continue;
      }
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        this.o.slots.release();
      };
      const p = this.o.target
        .execute(row, { release })
        .catch((err: unknown) => this.o.logger.error({ err }, 'job execution failed'))
        .finally(() => {
          release();
          this.inflight.delete(p);
        });
      this.inflight.add(p);
      if (gate.kind === 'probe') {
        this.probing = p;
        void p.finally(() => {
          if (this.probing === p) this.probing = null;
        });
      }
    }
  }

  /** Waits `ms` (NOTIFY wake-ups do not end it: the gate, not new work, is what holds the loop). */
  private pause(ms: number): Promise<void> {
    if (this.stopping) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.halt.signal.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.halt.signal.addEventListener('abort', done, { once: true });
    });
  }

  private idle(): Promise<void> {
    if (this.pendingWake || this.stopping) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const timer = setTimeout(done, this.pollMs);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.wakeUp = () => {
        this.wakeUp = null;
        done();
      };
    });
  }
}
