/**
 * The warm sandbox pool's decisions as pure functions of its state and the time (no I/O, no timers):
 * which sandbox a run claims, which waiting sandboxes are retired, which are started, and when the pool
 * must look again. `sandbox-pool.ts` does what these say; the unit tests drive them with a hand-set
 * clock through tables.
 */

/** A pool's sandbox as the decisions see it. */
export interface PoolEntryView {
  id: string;
  /** Pool key (job type and environment; see `poolKey`). */
  key: string;
  /** `starting`: the engine runs, the runner has not said `ready` yet. */
  state: 'starting' | 'ready';
  /** When it was started (epoch ms). */
  createdAt: number;
}

/** Start failures of one key in a row, for back-off. */
export interface FailureRecord {
  count: number;
  lastAt: number;
}

/** Everything {@link planPool} decides on. */
export interface PoolState {
  now: number;
  /** Sandboxes older than this (from their start) are retired and replaced. */
  maxIdleMs: number;
  /** Wanted number of sandboxes per key; keys not listed get none (their sandboxes are retired). */
  targets: ReadonlyMap<string, number>;
  entries: readonly PoolEntryView[];
  /** Most sandboxes starting at once, over all keys (starts cost CPU that runs need). */
  maxStarting: number;
  failures: ReadonlyMap<string, FailureRecord>;
}

/** What the pool should do now. */
export interface PoolPlan {
  /** Ids of sandboxes to destroy. */
  retire: string[];
  /** Keys to start one sandbox for, in order (a key may repeat). */
  start: string[];
  /** When to plan again at the latest (epoch ms), or null when nothing is due by time alone. */
  wakeAt: number | null;
}

/** First back-off after a failed start; doubles per failure in a row up to {@link MAX_BACKOFF_MS}. */
export const BASE_BACKOFF_MS = 1000;
export const MAX_BACKOFF_MS = 60_000;
/** A starting sandbox older than this is taken as stuck and retired. */
export const START_TIMEOUT_MS = 30_000;

/** Delay before the next start of a key after `count` failures in a row. */
export function backoffMs(count: number): number {
  if (count <= 0) return 0;
  return Math.min(MAX_BACKOFF_MS, BASE_BACKOFF_MS * 2 ** (count - 1));
}

/** Whether an entry is past its life: idle too long when ready, stuck when starting. */
function expired(e: PoolEntryView, s: Pick<PoolState, 'now' | 'maxIdleMs'>): boolean {
  const limit = e.state === 'ready' ? s.maxIdleMs : START_TIMEOUT_MS;
  return s.now - e.createdAt >= limit;
}

/**
 * The pool's plan: retire expired sandboxes and those of keys no longer wanted (or over target),
 * then start sandboxes for the keys furthest below target, one per key in turn, within `maxStarting`
 * and each key's back-off.
 */
export function planPool(s: PoolState): PoolPlan {
  const retire: string[] = [];
  const kept = new Map<string, PoolEntryView[]>();
  for (const e of s.entries) {
    const target = s.targets.get(e.key) ?? 0;
    if (expired(e, s) || target === 0) {
      retire.push(e.id);
      continue;
    }
    const list = kept.get(e.key) ?? [];
    list.push(e);
    kept.set(e.key, list);
  }
  // Over target (the size was lowered): the oldest go first.
  for (const [key, list] of kept) {
    const over = list.length - (s.targets.get(key) ?? 0);
    if (over <= 0) continue;
    const oldest = [...list].sort((a, b) => a.createdAt - b.createdAt).slice(0, over);
    for (const e of oldest) retire.push(e.id);
    kept.set(key, list.filter((e) => !oldest.includes(e)));
  }
  let starting = [...kept.values()].flat().filter((e) => e.state === 'starting').length;
  const missing = new Map<string, number>();
  let wakeAt: number | null = null;
  const wake = (t: number) => {
    wakeAt = wakeAt === null ? t : Math.min(wakeAt, t);
  };
  for (const [key, target] of [...s.targets].sort(([a], [b]) => a.localeCompare(b))) {
    const need = target - (kept.get(key)?.length ?? 0);
    if (need <= 0) continue;
    const f = s.failures.get(key);
    const ready = f ? f.lastAt + backoffMs(f.count) : s.now;
    if (ready > s.now) {
      wake(ready);
      continue;
    }
    missing.set(key, need);
  }
  const start: string[] = [];
  while (starting < s.maxStarting && missing.size > 0) {
    for (const [key, need] of missing) {
      if (starting >= s.maxStarting) break;
      start.push(key);
      starting++;
      if (need <= 1) missing.delete(key);
      else missing.set(key, need - 1);
    }
  }
  for (const list of kept.values()) for (const e of list) wake(e.createdAt + (e.state === 'ready' ? s.maxIdleMs : START_TIMEOUT_MS));
  return { retire, start, wakeAt };
}

/**
 * The sandbox a run of `key` claims: the oldest ready one not past the idle limit (oldest first, so
 * none ages out unused while newer ones are taken), or null (a miss: the run starts cold).
 */
export function pickWarm(entries: readonly PoolEntryView[], key: string, now: number, maxIdleMs: number): string | null {
  let best: PoolEntryView | null = null;
  for (const e of entries) {
    if (e.key !== key || e.state !== 'ready' || expired(e, { now, maxIdleMs })) continue;
    if (!best || e.createdAt < best.createdAt) best = e;
  }
  return best?.id ?? null;
}
