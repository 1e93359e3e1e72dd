/**
 * Ready session sandboxes per job type on the local runtime (issue 19: "a sandbox, from the warm pool
 * when one is ready, becomes this session's"). Each is started by the one function that starts every
 * local session sandbox (start-session.ts, given here as `start`), with the job type's own
 * requirements, so a pooled sandbox and a session's own are the same by construction; it is nobody's
 * until `take` hands it to one session, which then owns it to its end: a taken sandbox never comes
 * back. Nothing of a local session sandbox is per session (its egress proxy, cgroup and directories
 * are the sandbox's own), so nothing is bound at the claim beyond `warm`.
 *
 * How many: runtime/session-pool-sizing.ts (configured size, at least 1 while the type's sessions were
 * opened within `max_idle_sec`). One start at a time over all types, after a take, on a slow tick, and
 * with a back-off after a failed start: runs and the run pool share the machine. A ready sandbox that
 * dies while it waits is dropped (destroyed) and replaced. `stop` destroys the ready ones and those
 * still starting.
 */
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { Logger } from '../../../logger.ts';
import type { SessionPoolStats } from '../../session.ts';
import { planSessionPool, sessionPoolTargets } from '../../session-pool-sizing.ts';
import type { LocalSessionSandbox } from './session-sandbox.ts';

/** What the pool needs of the runtime. */
export interface SessionPoolOptions {
  /** `warm_pool.session_sizes`, by job type name. */
  sizes: Record<string, number>;
  /** The configured job types (the others are learnt from the sessions opened). */
  jobType(name: string): JobType | undefined;
  /** `warm_pool.max_idle_sec` in ms. */
  idleMs: number;
  /** Starts a session sandbox of the type with its own requirements (the path of every session). */
  start(jobType: JobType): Promise<LocalSessionSandbox>;
  now(): number;
  log: Logger;
  /** Period of the sizing tick (ms; default 1000). */
  tickMs?: number;
}

interface Ready {
  sandbox: LocalSessionSandbox;
  /** What it was started as (compared with the session's job type at the take). */
  fingerprint: string;
  startedAt: number;
}

/** Most starts in flight over all job types. */
const MAX_STARTING = 1;
/** Back-off after a failed start: doubles from 1 s up to this (ms). */
const MAX_BACKOFF_MS = 60_000;

/** What makes two job types start the same sandbox (all but what changes no sandbox). */
export function fingerprint(jt: JobType): string {
  const { warmPoolSize: _w, callbackUrl: _c, ...rest } = jt;
  return JSON.stringify(rest);
}

const sameSet = (a: readonly string[], b: readonly string[]) => {
  const s = new Set(a);
  return new Set(b).size === s.size && b.every((x) => s.has(x));
};

/** See the module comment. */
export class SessionPool {
  private readonly ready = new Map<string, Ready[]>();
  private readonly starting = new Map<string, number>();
  private readonly counters = new Map<string, { hits: number; misses: number }>();
  private readonly lastOpened = new Map<string, number>();
  /** The job type each name starts as: the last session's of that name, else the configured one. */
  private readonly types = new Map<string, JobType>();
  private readonly backoff = new Map<string, { until: number; ms: number }>();
  private readonly inFlight = new Set<Promise<void>>();
  private readonly timer: NodeJS.Timeout;
  private stopped = false;

  constructor(private readonly o: SessionPoolOptions) {
    for (const name of Object.keys(o.sizes)) {
      const jt = o.jobType(name);
      if (jt) this.types.set(name, jt);
      else o.log.warn({ job_type: name }, 'warm_pool.session_sizes names an unknown job type: no session sandboxes kept for it');
    }
    this.timer = setInterval(() => this.tick(), o.tickMs ?? 1000);
    this.timer.unref();
  }

  /**
   * A ready sandbox for a session of `jobType` asking for `requirements`, or null (the session starts
   * its own). Synchronous: two sessions never get the same one. Sessions asking for more than the
   * type's own requirements never take one and are not counted.
   */
  take(jobType: JobType, requirements: readonly string[], maxStreamBytes: number, poolStreamBytes: number): LocalSessionSandbox | null {
    if (this.stopped || !sameSet(requirements, jobType.requirements) || maxStreamBytes !== poolStreamBytes) return null;
    const name = jobType.name;
    this.lastOpened.set(name, this.o.now());
    this.types.set(name, jobType);
    const c = this.counters.get(name) ?? { hits: 0, misses: 0 };
    this.counters.set(name, c);
    const want = fingerprint(jobType);
    const list = this.ready.get(name) ?? [];
    let got: LocalSessionSandbox | null = null;
    while (list.length > 0 && !got) {
      const r = list.shift()!;
      // Started as another definition of the type (its config changed): not this session's sandbox.
      if (r.fingerprint === want && r.sandbox.ended === null) got = r.sandbox;
      else void r.sandbox.destroy().catch(() => {});
    }
    if (got) c.hits++;
    else c.misses++;
    if (got) got.warm = true;
    setImmediate(() => this.tick());
    return got;
  }

  /** Per job type: target, ready, starting, hits and misses (`/pool/stats` `sessions`, `/metrics`). */
  stats(): SessionPoolStats[] {
    const targets = this.targets();
    const names = new Set([...targets.keys(), ...this.counters.keys(), ...this.ready.keys()]);
    return [...names].sort().map((name) => {
      const c = this.counters.get(name) ?? { hits: 0, misses: 0 };
      return { job_type: name, target: targets.get(name) ?? 0, ready: this.ready.get(name)?.length ?? 0, starting: this.starting.get(name) ?? 0, hits: c.hits, misses: c.misses };
    });
  }

  private targets(): Map<string, number> {
    const names = new Set([...this.types.keys()]);
    const demand = [...names].map((n) => ({ jobType: n, configured: this.o.sizes[n] ?? 0, lastOpenedAt: this.lastOpened.get(n) ?? null }));
    return sessionPoolTargets(this.o.now(), demand, this.o.idleMs);
  }

  /** Starts up to the targets (within the budget) and retires ready ones over them that waited long. */
  tick(): void {
    if (this.stopped) return;
    const now = this.o.now();
    let budget = MAX_STARTING - [...this.starting.values()].reduce((s, n) => s + n, 0);
    for (const [name, target] of this.targets()) {
      const list = this.ready.get(name) ?? [];
      const b = this.backoff.get(name);
      const free = b && now < b.until ? 0 : budget;
      const plan = planSessionPool(now, { target, ready: list.map((r) => r.startedAt), starting: this.starting.get(name) ?? 0 }, this.o.idleMs, free);
      for (const i of [...plan.retire].sort((x, y) => y - x)) {
        const [r] = list.splice(i, 1);
        void r!.sandbox.destroy().catch(() => {});
      }
      for (let k = 0; k < plan.start; k++) this.startOne(name);
      budget -= plan.start;
    }
  }

  private startOne(name: string): void {
    const jt = this.types.get(name)!;
    const startedAt = this.o.now();
    this.starting.set(name, (this.starting.get(name) ?? 0) + 1);
    const q = this.o
      .start(jt)
      .then(
        (sandbox) => {
          this.backoff.delete(name);
          if (this.stopped) return sandbox.destroy();
          const r: Ready = { sandbox, fingerprint: fingerprint(jt), startedAt };
          const list = this.ready.get(name) ?? [];
          list.push(r);
          this.ready.set(name, list);
          // One that dies while it waits (nobody's yet) is dropped and replaced.
          sandbox.onEnd((e) => {
            const l = this.ready.get(name);
            const i = l?.indexOf(r) ?? -1;
            if (i < 0) return;
            l!.splice(i, 1);
            this.o.log.warn({ job_type: name, reason: e.reason, detail: e.detail.slice(0, 300) }, 'a ready session sandbox ended while it waited: replaced');
            void sandbox.destroy().catch(() => {});
            setImmediate(() => this.tick());
          });
        },
        (err: unknown) => {
          const ms = Math.min(MAX_BACKOFF_MS, (this.backoff.get(name)?.ms ?? 500) * 2);
          this.backoff.set(name, { until: this.o.now() + ms, ms });
          if (!this.stopped) this.o.log.warn({ job_type: name, err: String(err), retry_ms: ms }, 'a session sandbox for the pool could not be started');
        },
      )
      .finally(() => {
        this.starting.set(name, (this.starting.get(name) ?? 1) - 1);
        this.inFlight.delete(q);
        setImmediate(() => this.tick());
      });
    this.inFlight.add(q);
  }

  /** Destroys every ready sandbox and those still starting (the runtime stops). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    const all = [...this.ready.values()].flat();
    this.ready.clear();
    await Promise.allSettled([...all.map((r) => r.sandbox.destroy()), ...this.inFlight]);
  }
}
