/**
 * What `/pool/stats` and `/metrics` show of the local warm pool, per job type, as a pure function of
 * the pool's state and the time: target (configured, or following demand), ready and starting sandboxes, ages, hits, misses
 * and the refill time.
 */
import type { WarmPoolStats } from '../../runtime.ts';
import type { PoolEntryView } from './sandbox-pool-plan.ts';

/** Hits and misses of one job type. */
export interface Counters {
  hits: number;
  misses: number;
  /** Sandboxes restored from a checkpoint that became ready. */
  restored?: number;
}

/** A sandbox as the stats see it: its pool entry and its job type's name. */
export interface StatsEntry extends PoolEntryView {
  jobType: string;
}

/** Per job type (sorted by name): the sum of its keys' targets, its sandboxes and counters. */
export function poolStats(
  now: number,
  targets: readonly { jobType: string; size: number; refillMs: number | null }[],
  entries: readonly StatsEntry[],
  counters: ReadonlyMap<string, Counters>,
  restoring = false,
): WarmPoolStats[] {
  const names = new Set([...targets.map((t) => t.jobType), ...counters.keys()]);
  return [...names].sort().map((name) => {
    const mine = entries.filter((e) => e.jobType === name);
    const ages = mine.filter((e) => e.state === 'ready').map((e) => Math.max(0, now - e.createdAt));
    const c = counters.get(name) ?? { hits: 0, misses: 0 };
    const refills = targets.filter((t) => t.jobType === name && t.refillMs !== null).map((t) => t.refillMs!);
    return {
      job_type: name,
      target: targets.filter((t) => t.jobType === name).reduce((n, t) => n + t.size, 0),
      ready: ages.length,
      starting: mine.length - ages.length,
      oldest_age_ms: ages.length ? Math.max(...ages) : null,
      newest_age_ms: ages.length ? Math.min(...ages) : null,
      hits: c.hits,
      misses: c.misses,
      // The slowest of its keys' mean refill times (start to ready), null before any was measured.
      refill_ms: refills.length ? Math.round(Math.max(...refills)) : null,
      ...(restoring ? { restored: c.restored ?? 0 } : {}),
    };
  });
}
