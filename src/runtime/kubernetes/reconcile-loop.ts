/**
 * A controller's loop, as the warm pool and the session pool run it: one reconcile pass at a time, on
 * a timer and after informer events. A kick during a pass asks for exactly one more pass right after
 * it (kicks coalesce), never a second pass beside it; a failed pass is logged and the loop goes on.
 * Our own because it is these twenty lines: a controller framework would bring its own informers and
 * work queue, and ours (src/kube, runs/work-queue.ts) are what the runtime is built on.
 */
import type { Logger } from '../../logger.ts';

/** Subscribes a callback to a source of events; returns how to unsubscribe. */
export type Subscribe = (cb: () => void) => () => void;

export class ReconcileLoop {
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private again = false;
  private stoppedFlag = true;
  private offs: (() => void)[] = [];

  constructor(
    private readonly pass: () => Promise<void>,
    private readonly o: { what: string; log: Logger; intervalMs?: number },
  ) {}

  get stopped(): boolean {
    return this.stoppedFlag;
  }

  /** Runs a pass now, then on every event of `sources` and every `intervalMs` (default 2 s) until stopped. */
  start(sources: readonly Subscribe[]): void {
    this.stoppedFlag = false;
    this.offs = sources.map((on) => on(() => void this.kick()));
    const tick = () => {
      if (this.stoppedFlag) return;
      void this.kick();
      this.timer = setTimeout(tick, this.o.intervalMs ?? 2000);
      this.timer.unref();
    };
    tick();
  }

  stop(): void {
    this.stoppedFlag = true;
    for (const off of this.offs.splice(0)) off();
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** Runs a pass now, or right after the one in progress; resolves when that pass is done. */
  kick(): Promise<void> {
    if (this.stoppedFlag) return Promise.resolve();
    if (this.running) {
      this.again = true;
      return this.running;
    }
    this.running = (async () => {
      do {
        this.again = false;
        try {
          await this.pass();
        } catch (err) {
          this.o.log.warn({ err: String(err) }, `${this.o.what} reconcile failed`);
        }
      } while (this.again && !this.stoppedFlag);
    })().finally(() => {
      this.running = null;
    });
    return this.running;
  }
}
