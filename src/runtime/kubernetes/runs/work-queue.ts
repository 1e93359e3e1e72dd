/**
 * A keyed work queue: at most one worker call per key at a time; a key added while its worker runs
 * is run once more afterwards (changes are never lost, bursts are coalesced); a worker that throws is
 * retried with capped exponential backoff. Keys are independent of each other.
 */

/** Options of {@link KeyedWorkQueue}. */
export interface WorkQueueOptions {
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  onError?: (key: string, err: unknown, retryInMs: number) => void;
}

interface Entry {
  running: boolean;
  dirty: boolean;
  failures: number;
  timer: NodeJS.Timeout | null;
  timerAt: number;
}

/** See the module comment. */
export class KeyedWorkQueue {
  private readonly entries = new Map<string, Entry>();
  private stopped = false;

  constructor(
    private readonly worker: (key: string) => Promise<void>,
    private readonly opts: WorkQueueOptions = {},
  ) {}

  /** Runs the worker for `key` as soon as possible (after the current run of that key). */
  add(key: string): void {
    if (this.stopped) return;
    const e = this.entry(key);
    if (e.running) {
      e.dirty = true;
      return;
    }
    if (e.timer) {
      clearTimeout(e.timer);
      e.timer = null;
    }
    e.running = true;
    queueMicrotask(() => void this.run(key, e));
  }

  /** Runs the worker for `key` after `ms` (an earlier pending wake-up wins). */
  addAfter(key: string, ms: number): void {
    if (this.stopped) return;
    if (ms <= 0) return this.add(key);
    const e = this.entry(key);
    const at = Date.now() + ms;
    if (e.timer && e.timerAt <= at) return;
    if (e.timer) clearTimeout(e.timer);
    e.timerAt = at;
    e.timer = setTimeout(() => {
      e.timer = null;
      this.add(key);
    }, ms);
  }

  /** Forgets a key: pending wake-ups are cancelled (a running worker finishes). */
  forget(key: string): void {
    const e = this.entries.get(key);
    if (!e) return;
    if (e.timer) clearTimeout(e.timer);
    e.timer = null;
    e.dirty = false;
    if (!e.running) this.entries.delete(key);
  }

  /** Number of keys with pending or running work. */
  get size(): number {
    return this.entries.size;
  }

  /** Stops: no new work starts; running workers finish. */
  stop(): void {
    this.stopped = true;
    for (const e of this.entries.values()) if (e.timer) clearTimeout(e.timer);
  }

  private entry(key: string): Entry {
    let e = this.entries.get(key);
    if (!e) {
      e = { running: false, dirty: false, failures: 0, timer: null, timerAt: 0 };
      this.entries.set(key, e);
    }
    return e;
  }

  private async run(key: string, e: Entry): Promise<void> {
    for (;;) {
      e.dirty = false;
      try {
        await this.worker(key);
        e.failures = 0;
      } catch (err) {
        e.failures++;
        const initial = this.opts.backoffInitialMs ?? 100;
        const max = this.opts.backoffMaxMs ?? 10_000;
        const delay = Math.min(max, initial * 2 ** (e.failures - 1));
        this.opts.onError?.(key, err, delay);
        // New information arrived while failing: try again at once, otherwise back off.
        if (!e.dirty) {
          e.running = false;
          this.addAfter(key, delay);
          return;
        }
      }
      if (!e.dirty || this.stopped) break;
    }
    e.running = false;
    if (!e.timer && !e.dirty && this.entries.get(key) === e && e.failures === 0) this.entries.delete(key);
  }
}
