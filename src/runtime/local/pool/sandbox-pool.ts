/**
 * Warm sandboxes (issue 10): per job type, sandboxes started before any request, on the engine in
 * use, each waiting for exactly one program.
 *
 * A warm sandbox is everything a cold start makes, made early: its run directory (`code/` and
 * `input/` still empty, read-only in the sandbox as always; `output/`), its cgroup with the job
 * type's limits, and the engine (bwrap or runsc, started by a pre-forked spawner child that entered
 * the cgroup and dropped root exactly as for a cold run) running `runner.py --wait`: the interpreter
 * is loaded, the runner non-dumpable, and it blocks on one line on its stdin. Its stdin is a pipe of
 * the spawner's that takes that one line and is closed; the runner puts /dev/null over fd 0 before the
 * program exists. So the program sees what a cold run's program sees: the same mounts, limits,
 * environment, fds and PID 1.
 *
 * A claim takes the oldest ready sandbox of the run's key (job type shape, interpreter and environment: warm-env.ts): the host
 * writes `code/main.py` and `input/data.json` into the bind-mounted directories (bind mounts show host
 * writes; gVisor's default `--file-access-mounts=shared` revalidates), then the go line (timeout and
 * stream cap) goes down the pipe. The runner then runs the program exactly as a cold one, writes
 * `done N` after its report, and the runtime kills the cgroup and collects without waiting for the
 * engine's teardown. A sandbox is never handed out twice: a claimed entry leaves the pool, and the
 * runtime destroys it after the run.
 *
 * Every job type can be pooled (issue 18). A sandbox is made for one key (warm-env.ts): the job
 * type's shape, the interpreter and the environment at `/deps` (none, the job type's built
 * environment, or a cached install of a run's requirements). Runs whose environment is not there yet
 * start cold (and leave it cached); the key is then learned from the next run's claim (a miss) and
 * kept warm like a configured one while it is claimed, dropped after `max_idle_sec` without claims.
 * The job type's `preload` modules are imported by the waiting runner (`--preload`). A job type with
 * `allowed_hosts` gets its egress proxy at start, bound to the run at the claim (warm-egress.ts).
 * Without cgroups (not root) there is no spawner and no pool: every run starts cold.
 *
 * The pool's decisions (claim, retire, start, back-off) are pure functions in sandbox-pool-plan.ts;
 * this file does the I/O they call for and keeps the counters `/pool/stats` and `/metrics` show.
 */
import type { Clock } from '../../../clock.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { Logger } from '../../../logger.ts';
import type { WarmPoolStats } from '../../runtime.ts';
import type { CgroupLimits, CgroupSupport } from '../cgroups.ts';
import { runscDelete } from '../runs/proc.ts';
import type { SandboxHost } from '../sandbox.ts';
import { planPool, pickWarm, type FailureRecord } from './sandbox-pool-plan.ts';
import type { Spawner } from '../spawner.ts';
import { launchWarm, type PoolTarget } from './launch-warm.ts';
import { DemandTracker } from './demand.ts';
import { sizePool, type SizingOptions } from './pool-sizing.ts';
import { poolStats, type Counters } from './pool-stats.ts';
import type { RestoreImages } from './restore-images.ts';
import { WarmEgress } from './warm-egress.ts';
import { handOver, type Entry, type WarmSandbox } from './warm-entry.ts';
import { poolKey, type WarmEnv } from './warm-env.ts';

export type { PoolTarget } from './launch-warm.ts';

/** Options of {@link SandboxPool}. */
export interface SandboxPoolOptions {
  cgroups: CgroupSupport;
  spawner: Spawner;
  host: SandboxHost;
  runsDir: string;
  runsc: string | null;
  targets: PoolTarget[];
  /**
   * Job types kept warm by name and size (`warm_pool.sizes`): a claim of one of these for a key not
   * kept yet (another environment) makes it a target of this size.
   */
  sizes: ReadonlyMap<string, number>;
  /** Checkpoint images to restore sandboxes from (gVisor with `warm_pool.restore`); null: every sandbox boots. */
  restore: RestoreImages | null;
  /** Sizes that follow demand (`warm_pool.autoscale`, pool-sizing.ts); null: the configured sizes. */
  sizing: SizingOptions | null;
  maxIdleMs: number;
  maxStarting: number;
  /** Placeholder stream cap on the runner's command line (the go line sets the run's). */
  maxStreamBytes: number;
  /** The cgroup limits of a run of this job type (the same as a cold run's). */
  limitsFor(jobType: JobType, memoryBytes: number): CgroupLimits;
  clock: Clock;
  log: Logger;
  background(p: Promise<unknown>): void;
}

export type { WarmSandbox } from './warm-entry.ts';

/** Whether runs of this job type can use warm sandboxes at all: every job type can (issue 18). */
export function poolable(_jobType: JobType): boolean {
  return true;
}

/** Warm sandboxes per job type; see the file header. */
export class SandboxPool {
  private readonly entries: Entry[] = [];
  private readonly targets = new Map<string, PoolTarget>();
  private readonly failures = new Map<string, FailureRecord>();
  private readonly counters = new Map<string, Counters>();
  private readonly waiters = new Map<string, (() => void)[]>();
  /** Keys learned from claims (not configured), and when each was last claimed. */
  private readonly learned = new Map<string, number>();
  private readonly sizes: Map<string, number>;
  private readonly demand: DemandTracker;
  /** Each key's target as last planned (the configured size, or the demand's). */
  private planned = new Map<string, number>();
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private ticking = false;

  constructor(private readonly o: SandboxPoolOptions) {
    this.sizes = new Map(o.sizes);
    this.demand = new DemandTracker(o.sizing?.windowMs ?? 60_000);
    for (const t of o.targets) if (t.size > 0) this.setTarget(poolKey(t.jobType, t.interpreter, t.env), t);
  }

  /**
   * A ready sandbox for this run, now the caller's; null on a miss (no pool for the key, none ready,
   * or `env` null: the run's environment is not there yet), counted either way for job types kept
   * warm (a miss not with `countMiss` false: a reservation that missed, whose run claims again). A
   * missed key of a job type kept warm becomes a target (see the file header).
   */
  claim(jobType: JobType, interpreter: string, env: WarmEnv | null, countMiss = true): WarmSandbox | null {
    if (this.stopped) return null;
    // Only job types kept warm are counted (a pooled name whose definition changed counts a miss).
    if (!this.hasTargetFor(jobType.name)) return null;
    const c = this.counter(jobType.name);
    if (!env) {
      if (countMiss) c.misses++;
      return null;
    }
    const key = poolKey(jobType, interpreter, env);
    const now = this.o.clock.now();
    if (this.learned.has(key)) this.learned.set(key, now);
    if (countMiss) this.demand.claimed(key, now);
    const id = this.targets.has(key) ? pickWarm(this.entries, key, now, this.o.maxIdleMs) : null;
    const i = id === null ? -1 : this.entries.findIndex((e) => e.id === id);
    if (i < 0) {
      if (countMiss) c.misses++;
      this.learn(jobType, interpreter, env);
      return null;
    }
    c.hits++;
    const e = this.entries.splice(i, 1)[0]!;
    e.claimed = true;
    // No refill here: starting a sandbox now would take CPU from this very run. The runtime calls
    // tick() when the run has ended.
    return this.handOver(e);
  }

  /**
   * A run of a job type kept warm found (or, cold, left) this environment: its key becomes a target of
   * the job type's size, until no run claims it for max_idle_sec. Call tick() to start it.
   */
  learn(jobType: JobType, interpreter: string, env: WarmEnv): void {
    const key = poolKey(jobType, interpreter, env);
    const size = this.sizes.get(jobType.name) ?? 0;
    if (this.stopped || size <= 0) return;
    if (this.learned.has(key) || !this.targets.has(key)) this.learned.set(key, this.o.clock.now());
    if (!this.targets.has(key)) this.setTarget(key, { jobType, interpreter, size, env });
  }

  /**
   * Keeps `target.size` sandboxes of this job type warm from now on (added to, or replacing, the
   * configured targets) and resolves once one is ready. Rejects when the job type cannot be pooled.
   */
  async ensure(target: PoolTarget, timeoutMs = 60_000): Promise<void> {
    const key = poolKey(target.jobType, target.interpreter, target.env);
    this.setTarget(key, target);
    this.learned.delete(key);
    this.sizes.set(target.jobType.name, target.size);
    // Planned now, not at the next tick: the stats say the new size at once, and a smaller size retires
    // the excess (with one ready already, nothing else would tick soon).
    this.tick();
    if (this.entries.some((e) => e.key === key && e.state === 'ready')) return;
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no warm sandbox of ${target.jobType.name} became ready within ${timeoutMs} ms`)), timeoutMs);
      const list = this.waiters.get(key) ?? [];
      list.push(() => {
        clearTimeout(timer);
        resolve();
      });
      this.waiters.set(key, list);
    });
    this.tick();
    await ready;
  }

  /** Starts what the plan says (background); called at start and whenever the pool changed. */
  tick(): void {
    if (this.stopped || this.ticking) return;
    this.ticking = true;
    try {
      const now = this.o.clock.now();
      // Learned keys no run claimed for max_idle_sec are dropped (their sandboxes retired below).
      for (const [key, at] of this.learned) {
        if (now - at < this.o.maxIdleMs) continue;
        this.learned.delete(key);
        this.targets.delete(key);
        this.o.restore?.drop(key);
      }
      const sizing = this.o.sizing;
      const targets = sizing
        ? sizePool(now, [...this.targets].map(([k, t]) => this.demand.demand(k, t.size, now)), sizing)
        : new Map([...this.targets].map(([k, t]) => [k, t.size]));
      this.planned = targets;
      const plan = planPool({ now, maxIdleMs: this.o.maxIdleMs, targets, entries: this.entries, maxStarting: this.o.maxStarting, failures: this.failures });
      for (const id of plan.retire) {
        const i = this.entries.findIndex((e) => e.id === id);
        if (i >= 0) this.discard(this.entries.splice(i, 1)[0]!);
      }
      for (const key of plan.start) this.startOne(key, now);
      if (this.timer) clearTimeout(this.timer);
      this.timer = null;
      // Demand-following sizes change with time alone (claims leave the window, keys go idle).
      const wakeAt = sizing && this.targets.size > 0 ? Math.min(plan.wakeAt ?? Infinity, now + 1000) : plan.wakeAt;
      if (wakeAt !== null) {
        this.timer = setTimeout(() => this.tick(), Math.max(10, wakeAt - now));
        this.timer.unref();
      }
    } finally {
      this.ticking = false;
    }
  }

  /** Per job type: target, ready and starting sandboxes, their ages, hits and misses. */
  stats(): WarmPoolStats[] {
    const targets = [...this.targets].map(([k, t]) => ({ jobType: t.jobType.name, size: this.planned.get(k) ?? t.size, refillMs: this.demand.refillMs(k) }));
    return poolStats(this.o.clock.now(), targets, this.entries.map((e) => ({ ...e, jobType: e.target.jobType.name })), this.counters, this.o.restore !== null);
  }

  /** Destroys every waiting sandbox; no more are started. Resolves when they are gone. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await Promise.allSettled(this.entries.splice(0).map((e) => this.destroy(e)));
    this.o.restore?.clear();
  }

  private setTarget(key: string, t: PoolTarget): void {
    this.targets.set(key, t);
    this.demand.targeted(key, this.o.clock.now());
  }

  private hasTargetFor(name: string): boolean {
    if (this.sizes.has(name)) return true;
    for (const t of this.targets.values()) if (t.jobType.name === name) return true;
    return false;
  }

  private counter(name: string): Counters {
    let c = this.counters.get(name);
    if (!c) this.counters.set(name, (c = { hits: 0, misses: 0 }));
    return c;
  }

  private startOne(key: string, now: number): void {
    const o = this.o;
    const t = this.targets.get(key)!;
    const jt = t.jobType;
    const how = o.restore?.next(key) ?? { how: 'boot' as const };
    if (how.how === 'wait') return; // its template is booting: the image saves this boot
    const l = launchWarm(o, t, now, how.how === 'restore' ? how.image : undefined);
    if ('error' in l) {
      if (how.how === 'template') o.restore?.templateLost(key);
      return this.failed(key, l.error);
    }
    const { rd, cgroup, proc, egress, socketPath, runLimits } = l;
    const e: Entry = {
      id: rd.id,
      key,
      state: 'starting',
      createdAt: now,
      target: t,
      rd,
      cgroup,
      proc,
      runscId: l.runscId,
      runLimits,
      start: how.how,
      checkpointing: false,
      claimed: false,
      runnerReady: false,
      needsEgress: egress,
      egress: null,
      destroyed: false,
      stdout: '',
      stderrTail: '',
      out: [],
      err: [],
    };
    this.entries.push(e);
    if (egress) {
      WarmEgress.open(socketPath, o.log).then(
        (w) => {
          if (e.destroyed) return void o.background(w.close());
          e.egress = w;
          this.maybeReady(e);
        },
        (err: unknown) => {
          this.failed(key, `cannot start its egress proxy: ${(err as Error).message}`);
          const i = this.entries.indexOf(e);
          if (i >= 0) this.discard(this.entries.splice(i, 1)[0]!);
        },
      );
    }
    proc.onStdout((b) => {
      if (!e.runnerReady) {
        e.stdout += b.toString('latin1');
        const at = e.stdout.indexOf('ready\n');
        if (at < 0) return;
        e.runnerReady = true;
        if (e.start === 'template') return this.makeImage(e);
        const rest = Buffer.from(e.stdout.slice(at + 'ready\n'.length), 'latin1');
        e.stdout = '';
        if (rest.length) this.deliver(e, 'out', rest);
        this.maybeReady(e);
        return;
      }
      this.deliver(e, 'out', b);
    });
    proc.onStderr((b) => {
      if (!e.claimed) e.stderrTail = (e.stderrTail + b.toString('utf8')).slice(-2000);
      this.deliver(e, 'err', b);
    });
    // A restored sandbox says `ready` again when this reaches its runner (runner.py `ping`).
    if (how.how === 'restore') proc.write('ping\n');
    void proc.closed.then(([code, sig, error]) => {
      if (e.claimed || e.checkpointing) return;
      const i = this.entries.indexOf(e);
      if (i >= 0) this.entries.splice(i, 1);
      if (!this.stopped) {
        const why = `${error ?? `exited with ${code ?? sig}`}: ${e.stderrTail.trim()}`;
        if (e.state === 'starting' && e.start === 'template') o.restore?.templateLost(key);
        if (e.state === 'starting' && e.start === 'restore') o.restore?.failed(key, `a restored sandbox ${why}`);
        if (e.state === 'starting') this.failed(key, why);
        else o.log.warn({ job_type: jt.name, code, signal: sig }, 'a waiting warm sandbox ended');
      }
      o.background(this.destroy(e));
      setImmediate(() => this.tick());
    });
  }

  /** The template of its key said `ready`: checkpoint it (it stops), then refill from the image. */
  private makeImage(e: Entry): void {
    e.checkpointing = true;
    const work = async () => {
      const made = e.runscId !== null && !e.destroyed && (await this.o.restore!.checkpoint(e.key, e.runscId));
      if (!made && e.runscId === null) this.o.restore!.failed(e.key, 'the template has no runsc container');
      const i = this.entries.indexOf(e);
      if (i >= 0) this.entries.splice(i, 1);
      await this.destroy(e);
      setImmediate(() => this.tick());
    };
    this.o.background(work());
  }

  /** A sandbox is ready when its runner said so and its egress proxy (allowed_hosts types) listens. */
  private maybeReady(e: Entry): void {
    if (e.state !== 'starting' || e.destroyed || !e.runnerReady || (e.needsEgress && !e.egress)) return;
    e.state = 'ready';
    this.demand.refilled(e.key, this.o.clock.now() - e.createdAt);
    if (e.start === 'restore') {
      const c = this.counter(e.target.jobType.name);
      c.restored = (c.restored ?? 0) + 1;
    }
    this.failures.delete(e.key);
    for (const w of this.waiters.get(e.key)?.splice(0) ?? []) w();
    if (!e.claimed) setImmediate(() => this.tick());
  }

  private deliver(e: Entry, which: 'out' | 'err', b: Buffer): void {
    const sink = e[which];
    if (Array.isArray(sink)) sink.push(b);
    else sink(b);
  }

  private failed(key: string, why: string): void {
    const f = this.failures.get(key);
    this.failures.set(key, { count: (f?.count ?? 0) + 1, lastAt: this.o.clock.now() });
    this.o.log.warn({ pool: key, failures: (f?.count ?? 0) + 1, detail: why.slice(-2000) }, 'cannot start a warm sandbox');
  }

  private discard(e: Entry): void {
    this.o.background(this.destroy(e));
  }

  /** Kills the sandbox (its whole cgroup), waits for its engine process, removes its traces. */
  private async destroy(e: Entry): Promise<void> {
    if (e.destroyed) return;
    e.destroyed = true;
    e.cgroup.killAll();
    e.proc.kill();
    await e.proc.closed;
    if (e.runscId && this.o.runsc) await runscDelete(this.o.runsc, this.o.host.runscState, [e.runscId]);
    await e.cgroup.remove();
    await e.egress?.close();
    e.rd.remove();
  }

  private handOver(e: Entry): WarmSandbox {
    return handOver(e, () => this.destroy(e));
  }
}
