/**
 * Caps on concurrent event streams (issue 22 item 8): each open `GET /jobs/{id}/events` holds a
 * connection and a subscriber for as long as the client likes, so without a cap a few clients could
 * hold thousands and slow every other request. Per key (the token's short name; with authentication
 * off every caller shares one key) and in all; past either, the stream is refused with 429.
 */

/** The key of every caller when authentication is off (api/middleware/host-guard.ts sets it). */
export const SHARED_KEY = 'local';

/** An admitted stream: call `release` exactly once when it ends (later calls do nothing). */
export interface StreamTicket {
  release(): void;
}

/** Counts open streams against `max` in all and `perKey` per key. */
export class StreamLimits {
  private total = 0;
  private readonly byKey = new Map<string, number>();

  constructor(
    readonly max: number,
    readonly perKey: number,
  ) {}

  /** Streams open now. */
  get open(): number {
    return this.total;
  }

  /** Admits a stream for `key`, or says which cap refuses it. */
  acquire(key: string): StreamTicket | { refused: 'total' | 'per_token'; detail: string } {
    const mine = this.byKey.get(key) ?? 0;
    if (mine >= this.perKey) {
      const whose = key === SHARED_KEY ? 'by callers without a token (they share one allowance)' : 'for this token';
      return { refused: 'per_token', detail: `too many event streams open ${whose} (${mine} of http.max_event_streams_per_token ${this.perKey}); close one or retry later` };
    }
    if (this.total >= this.max) {
      return { refused: 'total', detail: `too many event streams open on this replica (${this.total} of http.max_event_streams ${this.max}); retry later` };
    }
    this.total++;
    this.byKey.set(key, mine + 1);
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        this.total--;
        const n = (this.byKey.get(key) ?? 1) - 1;
        if (n <= 0) this.byKey.delete(key);
        else this.byKey.set(key, n);
      },
    };
  }
}
