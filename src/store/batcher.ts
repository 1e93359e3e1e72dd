/**
 * Coalesces concurrent single-row writes into one statement. Items wait for the next turn of the
 * event loop (`setImmediate`), and while `maxInFlight` batches are being written they keep
 * collecting: an idle server adds no latency, and a busy one writes batches that grow with the load —
 * one round trip and one commit per batch instead of per request.
 */
export class Batcher<In, Out> {
  private pending: { item: In; resolve: (o: Out) => void; reject: (e: unknown) => void }[] = [];
  private scheduled = false;
  private inFlight = 0;

  /**
   * @param flush writes a batch; must return one result per item, in order.
   * @param maxBatch the most items one flush takes.
   * @param maxInFlight the most flushes running at once. One by default: under load a larger batch
   *   costs less CPU per row than overlapping round trips (`make bench`'s acceptance test: 1 in
   *   flight did best with per-row parameters; with the array insert 1 and 2 are within noise).
   */
  constructor(
    private readonly flush: (items: In[]) => Promise<Out[]>,
    private readonly maxBatch = 256,
    private readonly maxInFlight = 1,
  ) {}

  /** Adds one item; resolves with its result when its batch is written. */
  add(item: In): Promise<Out> {
    return new Promise<Out>((resolve, reject) => {
      this.pending.push({ item, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.maxInFlight || this.pending.length === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.start();
    });
  }

  private start(): void {
    if (this.inFlight >= this.maxInFlight || this.pending.length === 0) return;
    const batch = this.pending.splice(0, this.maxBatch);
    this.inFlight++;
    void this.write(batch).finally(() => {
      this.inFlight--;
      this.schedule();
    });
    // More than one batch waiting: start the next one too, if there is room.
    this.schedule();
  }

  private async write(batch: { item: In; resolve: (o: Out) => void; reject: (e: unknown) => void }[]): Promise<void> {
    try {
      const out = await this.flush(batch.map((b) => b.item));
      batch.forEach((b, i) => b.resolve(out[i]!));
    } catch (err) {
      if (batch.length === 1) batch[0]!.reject(err);
      // One bad item must not fail its neighbours: retry them one by one.
      else await Promise.all(batch.map((b) => this.flush([b.item]).then((o) => b.resolve(o[0]!), b.reject)));
    }
  }
}
