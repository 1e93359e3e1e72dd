/**
 * What `/pool/stats` and `/metrics` show of the local warm pool, per job type, as a pure function of
 * the pool's state and the time: target, ready and starting sandboxes, ages, hits and misses.
 */
import type { WarmPoolStats } from '../../runtime.ts';
import type { PoolEntryView } from './sandbox-pool-plan.ts';

/** Hits and misses of one job type. */
export interface Counters {
  hits: number;
  misses: number;
}

/** A sandbox as the stats see it: its pool entry and its job type's name. */
export interface StatsEntry extends PoolEntryView {
  jobType: string;
}

/** Per job type (sorted by name): the sum of its keys' targets, its sandboxes and counters. */
export function poolStats(now: number, targets: readonly { jobType: string; size: number }[], entries: readonly StatsEntry[], counters: ReadonlyMap<string, Counters>): WarmPoolStats[] {
  const names = new Set([...targets.map((t) => t.jobType), ...counters.keys()]);
  return [...names].sort().map((name) => {
    const mine = entries.filter((e) => e.jobType === name);
    const ages = mine.filter((e) => e.state === 'ready').map((e) => Math.max(0, now - e.createdAt));
    const c = counters.get(name) ?? { hits: 0, misses: 0 };
    return {
      job_type: name,
      target: targets.filter((t) => t.jobType === name).reduce((n, t) => n + t.size, 0),
      ready: ages.length,
      starting: mine.length - ages.length,
      oldest_age_ms: ages.length ? Math.max(...ages) : null,
      newest_age_ms: ages.length ? Math.min(...ages) : null,
      hits: c.hits,
      misses: c.misses,
    };
  });
}
