/**
 * Coalesces concurrent single-row writes into one statement: items added in the same tick are
 * flushed together on the next one (`setImmediate`), so an idle server adds no latency and a busy one
 * pays one round trip — and one commit — per batch instead of per request.
 */
export class Batcher<In, Out> {
  private pending: { item: In; resolve: (o: Out) => void; reject: (e: unknown) => void }[] = [];
  private scheduled = false;

  /**
   * @param flush writes a batch; must return one result per item, in order.
   * @param maxBatch the most items one flush takes.
   */
  constructor(
    private readonly flush: (items: In[]) => Promise<Out[]>,
    private readonly maxBatch = 256,
  ) {}

  /** Adds one item; resolves with its result when its batch is written. */
  add(item: In): Promise<Out> {
    return new Promise<Out>((resolve, reject) => {
      this.pending.push({ item, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => void this.run());
      }
    });
  }

  private async run(): Promise<void> {
    this.scheduled = false;
    while (this.pending.length > 0) {
      const batch = this.pending.splice(0, this.maxBatch);
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
}
