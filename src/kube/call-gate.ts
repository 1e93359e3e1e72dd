/**
 * At most `limit` API calls at work at once; the rest wait their turn, first come first served.
 *
 * The shared agent already puts no more than its sockets on the wire, but a call queued there has
 * been built already: its body serialized (a run's Secret is about 90 KB of JSON) and its promise
 * chain set up. A thousand runs starting together then built a thousand bodies in one turn of the
 * event loop (a pause of most of a second) and held them all until their turn came. Waiting here,
 * before the call is built, each body is made when a connection is about to take it.
 *
 * `urgent` calls (the leader's Lease renewals, whose deadline is short) do not queue behind the rest:
 * they go at once, and wait at most for one connection of the agent to come free.
 */
export class CallGate {
  private active = 0;
  private readonly waiting: { go: () => void; signal: AbortSignal; onAbort: () => void }[] = [];

  constructor(private readonly limit: number) {}

  /** Calls at work now (for tests). */
  get inUse(): number {
    return this.active;
  }

  /** Calls waiting for their turn (for tests). */
  get queued(): number {
    return this.waiting.length;
  }

  /**
   * Resolves when the call may go; rejects with `signal`'s reason if it is aborted first. Every call
   * that was let in must call {@link leave} once.
   */
  enter(signal: AbortSignal, urgent = false): Promise<void> {
    if (signal.aborted) return Promise.reject(signal.reason);
    if (urgent || this.active < this.limit) {
      this.active++;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const entry = {
        signal,
        go: () => {
          signal.removeEventListener('abort', entry.onAbort);
          this.active++;
          resolve();
        },
        onAbort: () => {
          const i = this.waiting.indexOf(entry);
          if (i >= 0) this.waiting.splice(i, 1);
          reject(signal.reason);
        },
      };
      signal.addEventListener('abort', entry.onAbort, { once: true });
      this.waiting.push(entry);
    });
  }

  /** A call that was let in is done: the next waiting one goes. */
  leave(): void {
    this.active--;
    while (this.active < this.limit && this.waiting.length > 0) this.waiting.shift()!.go();
  }
}
