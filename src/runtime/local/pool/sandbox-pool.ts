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
 * A claim takes the oldest ready sandbox of the run's key (job type digest and interpreter): the host
 * writes `code/main.py` and `input/data.json` into the bind-mounted directories (bind mounts show host
 * writes; gVisor's default `--file-access-mounts=shared` revalidates), then the go line (timeout and
 * stream cap) goes down the pipe. The runner then runs the program exactly as a cold one, writes
 * `done N` after its report, and the runtime kills the cgroup and collects without waiting for the
 * engine's teardown. A sandbox is never handed out twice: a claimed entry leaves the pool, and the
 * runtime destroys it after the run.
 *
 * Not pooled: runs with requirements (their environment is mounted per run) and job types with
 * `allowed_hosts` (a per-run egress proxy); they start cold. Without cgroups (not root) there is no
 * spawner and no pool: every run starts cold.
 *
 * The pool's decisions (claim, retire, start, back-off) are pure functions in sandbox-pool-plan.ts;
 * this file does the I/O they call for and keeps the counters `/pool/stats` and `/metrics` show.
 */
import { createHash } from 'node:crypto';
import path from 'node:path';
import type { Clock } from '../../../clock.ts';
import { parseMemory } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { Logger } from '../../../logger.ts';
import type { WarmPoolStats } from '../../runtime.ts';
import type { CgroupLimits, CgroupSupport, RunCgroup } from '../cgroups.ts';
import { runscDelete } from '../runs/proc.ts';
import { RunDir, sandboxId } from '../runs/run-dir.ts';
import { runnerSandbox } from '../runs/runner-command.ts';
import type { SandboxHost } from '../sandbox.ts';
import { planPool, pickWarm, type FailureRecord, type PoolEntryView } from './sandbox-pool-plan.ts';
import type { RunProc, SpawnedProc, Spawner } from '../spawner.ts';

/** One job type kept warm. */
export interface PoolTarget {
  jobType: JobType;
  interpreter: string;
  size: number;
}

/** Options of {@link SandboxPool}. */
export interface SandboxPoolOptions {
  cgroups: CgroupSupport;
  spawner: Spawner;
  host: SandboxHost;
  runsDir: string;
  runsc: string | null;
  targets: PoolTarget[];
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

/** A claimed sandbox: the run's now. */
export interface WarmSandbox {
  rd: RunDir;
  cgroup: RunCgroup;
  /** The engine process (stdout already past the runner's `ready` line). */
  proc: RunProc;
  runscId: string | null;
  /** CPU the cgroup used before the claim (interpreter and engine start), ms. */
  cpuBeforeMs: number;
  /** Hands the program over: the run directory's files are written already; this sends the go line. */
  go(timeoutSec: number, maxStreamBytes: number, env?: Record<string, string>): void;
  /** Kills it and removes everything of it (background). */
  destroy(): Promise<void>;
}

interface Entry extends PoolEntryView {
  target: PoolTarget;
  rd: RunDir;
  cgroup: RunCgroup;
  proc: SpawnedProc;
  runscId: string | null;
  claimed: boolean;
  stdout: string;
  stderrTail: string;
  out: ((b: Buffer) => void) | Buffer[];
  err: ((b: Buffer) => void) | Buffer[];
}

interface Counters {
  hits: number;
  misses: number;
}

/**
 * The key of a pool: the job type's name and everything of it a sandbox is made from (limits,
 * network, environment), and the interpreter. Not the spec digest alone: a run's job type must match
 * the sandbox's in every field that shaped it, whoever built the JobType object.
 */
export function poolKey(jobType: JobType, interpreter: string): string {
  const jt = jobType;
  const shape = [jt.pythonVersion, jt.memoryLimit, jt.cpuLimit, jt.maxProcesses, jt.maxFileSize, jt.network, Object.entries(jt.env).sort(), jt.requirements, interpreter];
  return `${jt.name}:${createHash('sha256').update(JSON.stringify(shape)).digest('hex').slice(0, 16)}`;
}

/** Whether runs of this job type can use warm sandboxes at all (else they always start cold). */
export function poolable(jobType: JobType): boolean {
  return jobType.requirements.length === 0 && !(jobType.network.mode === 'bridge' && jobType.network.allowedHosts.length > 0);
}

/** Warm sandboxes per job type; see the file header. */
export class SandboxPool {
  private readonly entries: Entry[] = [];
  private readonly targets = new Map<string, PoolTarget>();
  private readonly failures = new Map<string, FailureRecord>();
  private readonly counters = new Map<string, Counters>();
  private readonly waiters = new Map<string, (() => void)[]>();
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private ticking = false;

  constructor(private readonly o: SandboxPoolOptions) {
    for (const t of o.targets) if (t.size > 0 && poolable(t.jobType)) this.targets.set(poolKey(t.jobType, t.interpreter), t);
  }

  /**
   * A ready sandbox for this run, now the caller's; null on a miss (no pool for the key, or none
   * ready), counted either way for runs whose job type is pooled (a miss not with `countMiss`
   * false: a reservation that missed, whose run claims again).
   */
  claim(jobType: JobType, interpreter: string, requirements: string[], countMiss = true): WarmSandbox | null {
    if (this.stopped || requirements.length > 0 || !poolable(jobType)) return null;
    const key = poolKey(jobType, interpreter);
    // Only job types kept warm are counted (a pooled name whose definition changed counts a miss).
    if (!this.hasTargetFor(jobType.name)) return null;
    const id = this.targets.has(key) ? pickWarm(this.entries, key, this.o.clock.now(), this.o.maxIdleMs) : null;
    const c = this.counter(jobType.name);
    const i = id === null ? -1 : this.entries.findIndex((e) => e.id === id);
    if (i < 0) {
      if (countMiss) c.misses++;
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
   * Keeps `target.size` sandboxes of this job type warm from now on (added to, or replacing, the
   * configured targets) and resolves once one is ready. Rejects when the job type cannot be pooled.
   */
  async ensure(target: PoolTarget, timeoutMs = 60_000): Promise<void> {
    if (!poolable(target.jobType)) throw new Error(`job type ${target.jobType.name} cannot be kept warm (requirements or allowed_hosts)`);
    const key = poolKey(target.jobType, target.interpreter);
    this.targets.set(key, target);
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
      const targets = new Map([...this.targets].map(([k, t]) => [k, t.size]));
      const plan = planPool({ now, maxIdleMs: this.o.maxIdleMs, targets, entries: this.entries, maxStarting: this.o.maxStarting, failures: this.failures });
      for (const id of plan.retire) {
        const i = this.entries.findIndex((e) => e.id === id);
        if (i >= 0) this.discard(this.entries.splice(i, 1)[0]!);
      }
      for (const key of plan.start) this.startOne(key, now);
      if (this.timer) clearTimeout(this.timer);
      this.timer = null;
      if (plan.wakeAt !== null) {
        this.timer = setTimeout(() => this.tick(), Math.max(10, plan.wakeAt - now));
        this.timer.unref();
      }
    } finally {
      this.ticking = false;
    }
  }

  /** Per job type: target, ready and starting sandboxes, their ages, hits and misses. */
  stats(): WarmPoolStats[] {
    const now = this.o.clock.now();
    const names = new Set([...[...this.targets.values()].map((t) => t.jobType.name), ...this.counters.keys()]);
    return [...names].sort().map((name) => {
      const mine = this.entries.filter((e) => e.target.jobType.name === name);
      const ages = mine.filter((e) => e.state === 'ready').map((e) => Math.max(0, now - e.createdAt));
      const c = this.counters.get(name) ?? { hits: 0, misses: 0 };
      return {
        job_type: name,
        target: [...this.targets.values()].filter((t) => t.jobType.name === name).reduce((n, t) => n + t.size, 0),
        ready: ages.length,
        starting: mine.length - ages.length,
        oldest_age_ms: ages.length ? Math.max(...ages) : null,
        newest_age_ms: ages.length ? Math.min(...ages) : null,
        hits: c.hits,
        misses: c.misses,
      };
    });
  }

  /** Destroys every waiting sandbox; no more are started. Resolves when they are gone. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await Promise.allSettled(this.entries.splice(0).map((e) => this.destroy(e)));
  }

  private hasTargetFor(name: string): boolean {
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
    const memoryBytes = parseMemory(jt.memoryLimit);
    let rd: RunDir;
    let cgroup: RunCgroup;
    try {
      rd = RunDir.create({ host: o.host, runsDir: o.runsDir, id: sandboxId('w', now), program: 'later', tmpBytes: memoryBytes });
    } catch (err) {
      this.failed(key, `cannot create its directory: ${(err as Error).message}`);
      return;
    }
    try {
      cgroup = o.cgroups.create(rd.id, o.limitsFor(jt, memoryBytes));
    } catch (err) {
      rd.remove();
      this.failed(key, `cannot create its cgroup: ${(err as Error).message}`);
      return;
    }
    const spec = runnerSandbox({
      rd,
      interpreter: t.interpreter,
      runner: o.host.runnerFor(t.interpreter),
      jobType: jt,
      timeoutSec: jt.timeout,
      maxStreamBytes: o.maxStreamBytes,
      memoryBytes,
      fileSizeBytes: parseMemory(jt.maxFileSize),
      deps: false,
      egress: false,
      cgroups: true,
      inProcess: false,
      wait: true,
      sh: o.host.waitingShell(),
      procsFiles: [],
    });
    const launch = o.host.launch(spec, true);
    // The go line and the runner's answers pass through named pipes in the run directory (outside
    // every mount), so no process stands between the service and the runner on a run's path.
    const fifos = { in: path.join(rd.dir, 'go.fifo'), out: path.join(rd.dir, 'out.fifo') };
    const proc = o.spawner.warm({ procsFiles: cgroup.procsFiles, fdFiles: launch.fdFiles, drop: o.host.privilegeDrop(), fifos });
    if (!proc) {
      o.background(cgroup.remove().then(() => rd.remove()));
      this.failed(key, 'the spawner cannot start processes right now');
      return;
    }
    proc.launch({ file: launch.file, args: launch.args, env: launch.env, cwd: launch.cwd });
    const e: Entry = { id: rd.id, key, state: 'starting', createdAt: now, target: t, rd, cgroup, proc, runscId: launch.runscId ?? null, claimed: false, stdout: '', stderrTail: '', out: [], err: [] };
    this.entries.push(e);
    proc.onStdout((b) => {
      if (e.state === 'starting') {
        e.stdout += b.toString('latin1');
        const at = e.stdout.indexOf('ready\n');
        if (at < 0) return;
        e.state = 'ready';
        this.failures.delete(key);
        const rest = Buffer.from(e.stdout.slice(at + 'ready\n'.length), 'latin1');
        e.stdout = '';
        if (rest.length) this.deliver(e, 'out', rest);
        for (const w of this.waiters.get(key)?.splice(0) ?? []) w();
        if (!e.claimed) setImmediate(() => this.tick());
        return;
      }
      this.deliver(e, 'out', b);
    });
    proc.onStderr((b) => {
      if (!e.claimed) e.stderrTail = (e.stderrTail + b.toString('utf8')).slice(-2000);
      this.deliver(e, 'err', b);
    });
    void proc.closed.then(([code, sig, error]) => {
      if (e.claimed) return;
      const i = this.entries.indexOf(e);
      if (i >= 0) this.entries.splice(i, 1);
      if (!this.stopped) {
        if (e.state === 'starting') this.failed(key, `${error ?? `exited with ${code ?? sig}`}: ${e.stderrTail.trim()}`);
        else o.log.warn({ job_type: jt.name, code, signal: sig }, 'a waiting warm sandbox ended');
      }
      o.background(this.destroy(e));
      setImmediate(() => this.tick());
    });
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
    e.cgroup.killAll();
    e.proc.kill();
    await e.proc.closed;
    if (e.runscId && this.o.runsc) await runscDelete(this.o.runsc, this.o.host.runscState, [e.runscId]);
    await e.cgroup.remove();
    e.rd.remove();
  }

  private handOver(e: Entry): WarmSandbox {
    const route = (which: 'out' | 'err') => (cb: (b: Buffer) => void) => {
      const pending = e[which];
      e[which] = cb;
      if (Array.isArray(pending)) for (const b of pending) cb(b);
    };
    const cpuBeforeMs = e.cgroup.stats().cpuTimeMs ?? 0;
    return {
      rd: e.rd,
      cgroup: e.cgroup,
      runscId: e.runscId,
      cpuBeforeMs,
      proc: { onStdout: route('out'), onStderr: route('err'), kill: () => e.proc.kill(), closed: e.proc.closed },
      go: (timeoutSec, maxStreamBytes, env = {}) => e.proc.input(`${JSON.stringify({ timeout: timeoutSec, max_stream_bytes: maxStreamBytes, ...(Object.keys(env).length ? { env } : {}) })}\n`),
      destroy: () => this.destroy(e),
    };
  }
}
