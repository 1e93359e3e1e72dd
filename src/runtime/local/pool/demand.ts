/**
 * What the demand-following pool sizes (pool-sizing.ts) are computed from, per pool key: the times of
 * recent claims, the measured refill time (start to `ready`, an exponentially weighted mean) and when
 * the key became a target. Bookkeeping only; the decisions are pool-sizing.ts's.
 */
import type { KeyDemand } from './pool-sizing.ts';

/** Weight of the newest refill in the mean. */
const REFILL_WEIGHT = 0.3;

/** See the module comment. */
export class DemandTracker {
  private readonly claims = new Map<string, number[]>();
  private readonly refill = new Map<string, number>();
  private readonly since = new Map<string, number>();

  constructor(private readonly windowMs: number) {}

  /** A run of this key claimed (hit or miss) at `now`. */
  claimed(key: string, now: number): void {
    const list = (this.claims.get(key) ?? []).filter((t) => t > now - this.windowMs);
    list.push(now);
    this.claims.set(key, list);
  }

  /** A sandbox of this key took `ms` from its start to `ready`. */
  refilled(key: string, ms: number): void {
    const old = this.refill.get(key);
    this.refill.set(key, old === undefined ? ms : REFILL_WEIGHT * ms + (1 - REFILL_WEIGHT) * old);
  }

  /** The key is a target from `now` (kept if it was already). */
  targeted(key: string, now: number): void {
    if (!this.since.has(key)) this.since.set(key, now);
  }

  /** The mean refill time of this key, ms, or null before the first. */
  refillMs(key: string): number | null {
    return this.refill.get(key) ?? null;
  }

  /** The key's demand for {@link sizePool}, with `base` its configured size. */
  demand(key: string, base: number, now: number): KeyDemand {
    return { key, base, claims: this.claims.get(key) ?? [], refillMs: this.refillMs(key), since: this.since.get(key) ?? now };
  }
}
