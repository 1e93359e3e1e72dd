/**
 * Who may hold a connection to the egress proxy, and how many (issue 22 item 6: one run pod could cut
 * egress for every run by opening connections and sending nothing). Two phases, counted apart:
 * - pending: accepted, its request head not yet complete. Capped per source address (a run pod in the
 *   cluster; the one run of a local proxy) and in total, and each lasts at most the head deadline
 *   (proxy.ts), so silence costs a program its own places only, and only for seconds.
 * - admitted: the head was valid and, in the cluster, carried a valid run credential. Capped per run
 *   (execution id) and in total; the total is what readiness reports.
 * Pure bookkeeping: no sockets, no clock; the proxy calls it and answers 503 on a refusal.
 */

/** The limits; every one at least 1. */
export interface AdmissionLimits {
  /** Admitted connections at once, all runs together. */
  maxConnections: number;
  /** Admitted connections at once of one run. */
  maxConnectionsPerRun: number;
  /** Connections still sending their head, all sources together. */
  maxPending: number;
  /** Connections still sending their head from one source address. */
  maxPendingPerSource: number;
}

/** A snapshot for readiness and logs. */
export interface AdmissionStats {
  admitted: number;
  pending: number;
  maxConnections: number;
  maxPending: number;
  /** True when either total is at its cap: a new connection would be refused. */
  saturated: boolean;
}

/** Counts connections by phase; see the module comment. */
export class Admission {
  private readonly pendingBySource = new Map<string, number>();
  private readonly admittedByRun = new Map<string, number>();
  private pendingTotal = 0;
  private admittedTotal = 0;

  constructor(readonly limits: AdmissionLimits) {
    for (const [k, n] of Object.entries(limits)) {
      if (!Number.isInteger(n) || n < 1) throw new Error(`egress proxy ${k}: must be a positive integer, got ${n}`);
    }
  }

  /** A new connection from `source`: true when it may send its head, false when it is refused now. */
  openPending(source: string): boolean {
    const mine = this.pendingBySource.get(source) ?? 0;
    if (this.pendingTotal >= this.limits.maxPending || mine >= this.limits.maxPendingPerSource) return false;
    this.pendingBySource.set(source, mine + 1);
    this.pendingTotal++;
    return true;
  }

  /** The head phase of a connection from `source` ended (head complete, refused, timed out or closed). */
  closePending(source: string): void {
    const mine = this.pendingBySource.get(source) ?? 0;
    if (mine <= 0) return;
    if (mine === 1) this.pendingBySource.delete(source);
    else this.pendingBySource.set(source, mine - 1);
    this.pendingTotal--;
  }

  /** A valid head of run `run`: admitted, or which cap refused it. */
  admit(run: string): { admitted: true } | { refused: string } {
    if (this.admittedTotal >= this.limits.maxConnections) return { refused: 'too many connections through the egress proxy' };
    const mine = this.admittedByRun.get(run) ?? 0;
    if (mine >= this.limits.maxConnectionsPerRun) return { refused: `too many connections of this run through the egress proxy (at most ${this.limits.maxConnectionsPerRun})` };
    this.admittedByRun.set(run, mine + 1);
    this.admittedTotal++;
    return { admitted: true };
  }

  /** An admitted connection of `run` closed. */
  release(run: string): void {
    const mine = this.admittedByRun.get(run) ?? 0;
    if (mine <= 0) return;
    if (mine === 1) this.admittedByRun.delete(run);
    else this.admittedByRun.set(run, mine - 1);
    this.admittedTotal--;
  }

  stats(): AdmissionStats {
    const { maxConnections, maxPending } = this.limits;
    return {
      admitted: this.admittedTotal,
      pending: this.pendingTotal,
      maxConnections,
      maxPending,
      saturated: this.admittedTotal >= maxConnections || this.pendingTotal >= maxPending,
    };
  }
}
