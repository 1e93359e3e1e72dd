/**
 * Warm pool sizes that follow demand (issue 18), as pure functions of the claims seen, the measured
 * refill time and the time; no I/O, no timers (the pool calls {@link sizePool} on each tick).
 *
 * The model: each claim takes a ready sandbox and starts a refill that takes R (start to `ready`).
 * A pool of n sandboxes per key is then a loss system with n servers: a claim misses exactly when all
 * n are refilling. With claims arriving at rate λ, the offered load is A = λ·R, and the share of claims
 * that miss is Erlang's B formula B(n, A) (insensitive to the refill time's distribution). The target
 * is the smallest n whose B(n, A) is at most `missTarget`, at least the configured size while the key
 * is in use, at most `maxPerType`; a key without a claim for `idleMs` goes to zero; and when all
 * targets together exceed `maxTotal`, the largest are cut first.
 */

/** Knobs of {@link sizePool} (config `warm_pool.autoscale`). */
export interface SizingOptions {
  /** Most sandboxes of one key. */
  maxPerType: number;
  /** Most sandboxes of all keys together. */
  maxTotal: number;
  /** Claims within this window (ms) give the rate. */
  windowMs: number;
  /** A key without a claim (or start) for this long (ms) goes to zero. */
  idleMs: number;
  /** The share of claims allowed to miss, e.g. 0.1. */
  missTarget: number;
}

/** One key's demand as the sizing sees it. */
export interface KeyDemand {
  key: string;
  /** Configured (or learned) size: the least kept while the key is in use. */
  base: number;
  /** Times (epoch ms) of its recent claims, hits and misses. */
  claims: readonly number[];
  /** Measured time from a sandbox's start to its `ready` (ms), null before the first. */
  refillMs: number | null;
  /** When the key became a target (epoch ms): its idle time counts from here before any claim. */
  since: number;
}

/** Refill time assumed before one was measured. */
export const DEFAULT_REFILL_MS = 1000;

/** Erlang's B formula: the share of arrivals that find all `n` servers busy at offered load `a`. */
export function erlangB(n: number, a: number): number {
  let b = 1;
  for (let k = 1; k <= n; k++) b = (a * b) / (k + a * b);
  return b;
}

/** The smallest n ≤ `max` with B(n, a) ≤ `missTarget` (`max` when none is). */
export function sandboxesFor(a: number, missTarget: number, max: number): number {
  if (a <= 0) return 0;
  for (let n = 1; n <= max; n++) if (erlangB(n, a) <= missTarget) return n;
  return max;
}

/** Claims per second of a key over the window ending `now`. */
export function claimRate(claims: readonly number[], now: number, windowMs: number): number {
  const recent = claims.filter((t) => t > now - windowMs && t <= now).length;
  return recent / (windowMs / 1000);
}

/** Each key's target now (see the module comment). */
export function sizePool(now: number, keys: readonly KeyDemand[], o: SizingOptions): Map<string, number> {
  const out = new Map<string, number>();
  for (const k of [...keys].sort((a, b) => a.key.localeCompare(b.key))) {
    const last = Math.max(k.since, ...k.claims);
    if (now - last >= o.idleMs) {
      out.set(k.key, 0);
      continue;
    }
    const load = claimRate(k.claims, now, o.windowMs) * ((k.refillMs ?? DEFAULT_REFILL_MS) / 1000);
    out.set(k.key, Math.min(o.maxPerType, Math.max(k.base, sandboxesFor(load, o.missTarget, o.maxPerType))));
  }
  let total = [...out.values()].reduce((s, n) => s + n, 0);
  while (total > o.maxTotal) {
    // The largest target gives one up (ties: the first key by name), so small keys keep theirs.
    let top: string | null = null;
    for (const [key, n] of out) if (top === null || n > out.get(top)!) top = key;
    out.set(top!, out.get(top!)! - 1);
    total--;
  }
  return out;
}
