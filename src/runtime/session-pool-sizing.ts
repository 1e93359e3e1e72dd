/**
 * How many ready session sandboxes each job type keeps (issue 19: "a sandbox, from the warm pool when
 * one is ready, becomes this session's"), the same on both runtimes, as pure functions of the
 * configuration, the last session opens and the time; no I/O, no timers. The runtimes' session pools
 * (local: runtime/local/session/session-pool.ts; Kubernetes: its session pool) call them on each tick.
 *
 * A job type's target is its configured size (`warm_pool.session_sizes`, default `{ default: 1 }`),
 * and at least 1 while sessions of it were opened within `max_idle_sec` (the demand floor): a type
 * that is used keeps one ready, a type neither configured nor used goes to zero. A ready sandbox over
 * the target is retired once it has waited `max_idle_sec` (the oldest first); up to the target they
 * stay, however long they wait. Starts are bounded by a budget the caller gives (the run pool's
 * starts and the runs themselves share the machine).
 */

/** One job type as {@link sessionPoolTargets} sees it. */
export interface SessionTypeDemand {
  jobType: string;
  /** Its `warm_pool.session_sizes` entry (0 when it has none). */
  configured: number;
  /** When a session of it was last opened (epoch ms; hit or miss), null if never. */
  lastOpenedAt: number | null;
}

/** Each job type's target now (see the module comment). */
export function sessionPoolTargets(now: number, types: readonly SessionTypeDemand[], idleMs: number): Map<string, number> {
  const out = new Map<string, number>();
  for (const t of types) {
    const used = t.lastOpenedAt !== null && now - t.lastOpenedAt < idleMs;
    out.set(t.jobType, Math.max(t.configured, used ? 1 : 0));
  }
  return out;
}

/** One job type's pool as {@link planSessionPool} sees it. */
export interface SessionPoolState {
  target: number;
  /** Start times (epoch ms) of its ready sandboxes. */
  ready: readonly number[];
  /** Sandboxes still starting. */
  starting: number;
}

/** What to do for one job type now. */
export interface SessionPoolPlan {
  /** Sandboxes to start. */
  start: number;
  /** Indexes into `ready` of the sandboxes to retire (destroy), oldest first. */
  retire: number[];
}

/** Starts up to the target (at most `startBudget`), and retires ready ones over it that waited `idleMs`. */
export function planSessionPool(now: number, s: SessionPoolState, idleMs: number, startBudget: number): SessionPoolPlan {
  const have = s.ready.length + s.starting;
  const start = Math.max(0, Math.min(startBudget, s.target - have));
  const retire: number[] = [];
  let over = have - s.target;
  const oldestFirst = s.ready.map((t, i) => ({ t, i })).sort((a, b) => a.t - b.t || a.i - b.i);
  for (const { t, i } of oldestFirst) {
    if (over <= 0) break;
    if (now - t < idleMs) break;
    retire.push(i);
    over--;
  }
  return { start, retire };
}
