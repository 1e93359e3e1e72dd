/**
 * Worker slots: at most `size` sandboxes run at once in this process, sync and async alike.
 * Sync requests are served before queued async work (a caller is waiting on the socket).
 */
export class Slots {
  private busyCount = 0;
  private readonly waiters: { priority: boolean; resolve: () => void }[] = [];
  constructor(readonly size: number) {}

  get busy(): number {
    return this.busyCount;
  }
  get free(): number {
    return Math.max(0, this.size - this.busyCount);
  }
  get waiting(): number {
    return this.waiters.length;
  }

  /** Takes a slot without waiting; false when none is free or someone is waiting already. */
  tryAcquire(): boolean {
    if (this.busyCount < this.size && this.waiters.length === 0) {
      this.busyCount += 1;
      return true;
    }
    return false;
  }

  /** Waits for a slot. `priority` callers go before the others. Rejects if `signal` aborts first. */
  acquire(priority = false, signal?: AbortSignal): Promise<void> {
    if (this.tryAcquire()) return Promise.resolve();
    if (signal?.aborted) return Promise.reject(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
    return new Promise<void>((resolve, reject) => {
      // The listener goes once the slot is granted: the dispatcher passes one long-lived signal to
      // every wait, so a listener left behind per wait would pile up for the life of the process.
      const onAbort = () => {
        const i = this.waiters.indexOf(entry);
        if (i !== -1) {
          this.waiters.splice(i, 1);
          reject(signal!.reason instanceof Error ? signal!.reason : new Error('aborted'));
        }
      };
      const entry = {
        priority,
        resolve: () => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        },
      };
      if (priority) {
        const firstNormal = this.waiters.findIndex((w) => !w.priority);
        this.waiters.splice(firstNormal === -1 ? this.waiters.length : firstNormal, 0, entry);
      } else this.waiters.push(entry);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Gives a slot back (to the first waiter, if any). */
  release(): void {
    const next = this.waiters.shift();
    if (next) next.resolve();
    else this.busyCount = Math.max(0, this.busyCount - 1);
  }
}
