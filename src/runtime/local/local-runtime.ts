/**
 * The local runtime: runs each job in a sandbox on this machine with gVisor (`runsc`), bubblewrap
 * (`bwrap`) or, in `permissive` mode only, a plain process. This file is the runtime's life cycle
 * (start, stop, health) and one run as a sequence of steps. The folder says its three concerns:
 * `runs/` (one run's path: `steps.ts` the cold run's steps, `warm-run.ts` a run on a warm sandbox,
 * `run-dir.ts` its directory and mounts, `runner-command.ts`, `proc.ts` spawn and deadline,
 * `collect.ts` what the run left, `egress-proxy.ts`), `pool/` (warm sandboxes per job type, their
 * pure plan, reservations, warm processes) and `builds/` (requirement environments, their install
 * sandbox, job-type builds). Beside them, what every path shares: `workspace.ts`, `engine-probe.ts`
 * (engine choice), `cgroups.ts`, `sandbox.ts` (the engine's command), `spawner.ts`.
 *
 * One run, start to end:
 *  1. startup: the run directory is written (`code/main.py`, `input/data.json`, `output/`), requirements
 *     are made available (cached environment, or a pip install in its own sandbox), the run's cgroups
 *     are created, and the sandbox is started with `src/sandbox/runner.py` as its command;
 *  2. execution: the runner signals (on its stdout) that user code starts; the runtime's backstop
 *     deadline becomes `timeout + grace` (just `timeout` for a program run in the runner's own process,
 *     `--exec`, which bubblewrap runs from a warm process use: see {@link LocalRuntimeImpl.run});
 *  3. the sandbox exits (or is killed by the deadline / a cancel); the runtime reads the cgroup's
 *     counters (trusted), the runner's report and streams (untrusted) and `/output`, and removes
 *     everything of the run in the background.
 *
 * Process creation: with cgroups (root), a small Python process (`spawner.py`) keeps pre-forked warm
 * children that already sit in a run's cgroups and dropped root; Node never forks itself per run.
 *
 * Layout on the host: `<workspace>/sandbox/<instance>/` with `runs/` (one directory per run),
 * `deps/` (requirement environments and pip's cache), `<engine>/` (the engine's root: `rootfs/`, whose
 * `etc/` is the sandbox's /etc for every engine, `runner/`, a copy of runner.py readable by uid 1000,
 * and `runsc/` state).
 */
import path from 'node:path';
import { systemClock, type Clock } from '../../clock.ts';
import { parseMemory, warmPoolSizes, type Config } from '../../config.ts';
import { FileJobTypeRegistry, type JobType } from '../../jobtypes/job-type.ts';
import { silentLogger, type Logger } from '../../logger.ts';
import { baseObservation } from '../run-output.ts';
import { RunGoneError, type RawRun, type RunOptions, type RunSpec, type Runtime, type RuntimeHealth, type WarmPoolStats } from '../runtime.ts';
import { type SessionOpenOptions, type SessionPoolStats, type SessionSandbox } from '../session.ts';
import { LocalBuilder } from './builds/build.ts';
import { DepsCache } from './builds/deps.ts';
import type { InstallContext } from './builds/install-sandbox.ts';
import { detectCgroups, type CgroupSupport } from './cgroups.ts';
import { chooseEngine, defaultInterpreter } from './engine-probe.ts';
import { findEngineBinaries, type EngineBinaries, type EngineName } from './engines.ts';
import { Reservations } from './pool/reservations.ts';
import { RestoreImages } from './pool/restore-images.ts';
import { SandboxPool, type PoolTarget } from './pool/sandbox-pool.ts';
import type { SizingOptions } from './pool/pool-sizing.ts';
import { warmEnvFor, type WarmEnv, type WarmEnvSources } from './pool/warm-env.ts';
import { WarmPool } from './pool/warm-pool.ts';
import { collectRun } from './runs/collect.ts';
import { runscDelete } from './runs/proc.ts';
import { RunDir, sandboxId } from './runs/run-dir.ts';
import type { Prepared, RunContext, RunState } from './runs/run-state.ts';
import { execute, finish, observe, openEgress, placeInCgroups, prepareRequirements, runLimits } from './runs/steps.ts';
import { SessionPool } from './session/session-pool.ts';
import { newLocalSessionPool, startSessionSandbox } from './session/start-session.ts';
import { runWarm } from './runs/warm-run.ts';
import { SandboxHost } from './sandbox.ts';
import { Spawner } from './spawner.ts';
import { checkTraversable, claimWorkspace, instanceRoot, prepareRunsDir, releaseRunsDir, releaseWorkspace } from './workspace.ts';

/** Options of {@link createLocalRuntime}. */
export interface LocalRuntimeOptions {
  logger?: Logger;
  /** Time source for the runs' timestamps and deadlines (default: the system clock). */
  clock?: Clock;
}

/** The local runtime; `engine` is known after `start()`. */
export interface LocalRuntime extends Runtime {
  readonly engine: EngineName | null;
  /**
   * Keeps `size` warm sandboxes of this job type from now on and resolves once one is ready (tests
   * and tools; the service configures its pools with `warm_pool.sizes`). Rejects without a pool
   * (no cgroups, or the `process` engine) or for a job type that cannot be pooled.
   */
  prewarm(jobType: JobType, size?: number, requirements?: readonly string[]): Promise<void>;
  reserve(spec: RunSpec): void;
  unreserve(executionId: string): void;
  warmPoolStats(): WarmPoolStats[];
  sessionPoolStats(): SessionPoolStats[];
}

/** Most warm processes kept, whatever max_workers says. */
const MAX_WARM = 8;
/**
 * Creates the local runtime. Nothing happens until `start()`, which picks the engine
 * (`sandbox_engine`, `security_mode`), proves it works by running a sandbox, and removes what earlier
 * runs of this workspace left behind. `start()` throws when no allowed engine works — in `strict`
 * mode that means gVisor is missing or broken.
 */
export function createLocalRuntime(config: Config, options: LocalRuntimeOptions = {}): LocalRuntime {
  return new LocalRuntimeImpl(config, options.logger ?? silentLogger, options.clock ?? systemClock);
}

class LocalRuntimeImpl implements LocalRuntime {
  readonly name = 'local';
  private p: Prepared | null = null;
  private readonly bins: EngineBinaries;
  private readonly root: string;
  private readonly instance: string;
  private readonly cleanups = new Set<Promise<void>>();
  /** Teardowns of warm sandboxes whose runs ended, waiting out a moment (runs/warm-run.ts). */
  private readonly teardowns = new Set<() => void>();
  /** Warm sandboxes reserved for runs whose records are being written, by execution id. */
  private readonly reservations: Reservations;
  /** What the run steps (runs/) use of this runtime. */
  private readonly ctx: RunContext;
  private readonly probeErrors: Partial<Record<EngineName, string>> = {};
  private gvisorWorks = false;
  /** Ready session sandboxes per job type (session/session-pool.ts); null where sessions cannot run. */
  private sessionPool: SessionPool | null = null;
  /** Job-type builds (build.ts): usable once started. */
  readonly builder: LocalBuilder;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    private readonly clock: Clock,
  ) {
    this.bins = findEngineBinaries(config);
    ({ root: this.root, instance: this.instance } = instanceRoot(config));
    this.builder = new LocalBuilder(path.join(this.root, 'builds'), config, () => (this.p ? { install: this.installContext(this.p) } : null), clock);
    const background = (q: Promise<unknown>) => this.background(q);
    this.reservations = new Reservations({ pool: () => this.p?.sandboxes ?? null, log, background });
    this.ctx = { config, clock, log, builder: this.builder, runsc: this.bins.runsc, installContext: (p) => this.installContext(p), background };
  }

  get engine(): EngineName | null {
    return this.p?.engine ?? null;
  }

  async start(): Promise<void> {
    if (this.p) return;
    checkTraversable(this.root, this.config.workspace);
    // start() removes what earlier processes of this workspace left behind, so two live processes
    // must never share one: the second would destroy the first's runs.
    claimWorkspace(this.root, this.config.workspace);
    const cgroups = process.getuid?.() === 0 ? detectCgroups(this.instance) : null;
    const runsDir = path.join(this.root, 'runs');
    // As root (with cgroups to charge it to), run outputs live in memory: a run that writes a lot hits
    // its own memory limit instead of filling the host's disk.
    const runsTmpfs = await prepareRunsDir(runsDir, cgroups !== null);
    try {
      await this.startEngine(cgroups, runsDir, runsTmpfs);
    } catch (err) {
      await releaseRunsDir(runsDir, runsTmpfs);
      releaseWorkspace(this.root);
      throw err;
    }
  }

  private async startEngine(cgroups: CgroupSupport | null, runsDir: string, runsTmpfs: boolean): Promise<void> {
    const deps = new DepsCache(path.join(this.root, 'deps'), SandboxHost.ownBySandbox, this.clock);
    const { engine, host } = await chooseEngine({ config: this.config, bins: this.bins, root: this.root, runsDir, log: this.log, clock: this.clock, probeErrors: this.probeErrors });
    if (engine === 'gvisor') this.gvisorWorks = true;
    const orphans = cgroups ? await cgroups.removeOrphans() : 0;
    const spawner = cgroups ? new Spawner(defaultInterpreter(this.config), (detail) => this.log.warn({ detail }, 'sandbox spawner')) : null;
    const warm =
      cgroups && spawner
        ? new WarmPool({ cgroups, spawner, host, target: Math.min(Math.max(this.config.max_workers, 1), MAX_WARM), clock: this.clock, log: this.log, background: (q) => this.background(q) })
        : null;
    const sandboxes = cgroups && spawner && engine !== 'process' ? this.sandboxPool(cgroups, spawner, host, runsDir, deps) : null;
    this.p = { engine, host, cgroups, deps, runsDir, runsTmpfs, spawner, warm, sandboxes };
    warm?.refill();
    sandboxes?.tick();
    this.sessionPool = newLocalSessionPool(this.ctx, this.p);
    this.sessionPool?.tick();
    this.log.info(
      { engine, limits: cgroups ? `cgroups-v${cgroups.version}` : 'rlimits', orphan_cgroups: orphans, runs_tmpfs: runsTmpfs },
      engine === 'process' ? 'local runtime started WITHOUT isolation (process engine)' : 'local runtime started',
    );
  }

  /**
   * The warm sandbox pool of `warm_pool.sizes` (job types from the config file, as the service's
   * registry). Every job type can be kept warm: one whose environment exists now (none, built, or
   * cached) is a target from the start; one whose environment is not there yet starts warming once a
   * run's cold start has left it (pool/warm-env.ts).
   */
  private sandboxPool(cgroups: CgroupSupport, spawner: Spawner, host: SandboxHost, runsDir: string, deps: DepsCache): SandboxPool | null {
    const registry = new FileJobTypeRegistry(this.config);
    const targets: PoolTarget[] = [];
    const sizes = new Map<string, number>();
    for (const [name, size] of Object.entries(warmPoolSizes(this.config))) {
      const jobType = registry.get(name);
      const interpreter = jobType ? this.config.python_interpreters[jobType.pythonVersion] : undefined;
      if (!jobType || !interpreter) {
        this.log.warn({ job_type: name }, 'warm_pool.sizes names an unknown job type (or one without an interpreter): not kept warm');
        continue;
      }
      if (size <= 0) continue;
      sizes.set(name, size);
      const env = warmEnvFor(this.envSources(deps), jobType, jobType.requirements, interpreter);
      if (env) targets.push({ jobType, interpreter, size, env });
      else this.log.info({ job_type: name }, 'warm sandboxes of this job type start once its environment is installed (by its first run) or built');
    }
    return sizes.size === 0 ? null : this.newPool(cgroups, spawner, host, runsDir, targets, sizes);
  }

  private envSources(deps: DepsCache): WarmEnvSources {
    return { config: this.config, builder: this.builder, envsDir: deps.envsDir };
  }

  /** The environment a run would find ready now (null: it starts cold; see pool/warm-env.ts). */
  private warmEnv(p: Prepared, spec: RunSpec, interpreter: string): WarmEnv | null {
    return warmEnvFor(this.envSources(p.deps), spec.jobType, spec.requirements, interpreter);
  }

  /** `warm_pool.autoscale` as the pool's sizing options (null when off). */
  private sizing(): SizingOptions | null {
    const a = this.config.warm_pool.autoscale;
    if (!a.enabled) return null;
    const idleMs = this.config.warm_pool.max_idle_sec * 1000;
    return { maxPerType: a.max_per_type, maxTotal: a.max_total, windowMs: a.window_sec * 1000, idleMs, missTarget: a.miss_target };
  }

  private newPool(cgroups: CgroupSupport, spawner: Spawner, host: SandboxHost, runsDir: string, targets: PoolTarget[], sizes: Map<string, number>): SandboxPool {
    return new SandboxPool({
      cgroups,
      spawner,
      host,
      runsDir,
      runsc: this.bins.runsc,
      targets,
      sizes,
      restore:
        host.engine === 'gvisor' && this.config.warm_pool.restore
          ? new RestoreImages({ dir: path.join(this.root, 'images'), checkpointCommand: (id, dir) => host.checkpointCommand(id, dir), log: this.log })
          : null,
      sizing: this.sizing(),
      maxIdleMs: this.config.warm_pool.max_idle_sec * 1000,
      maxStarting: this.config.warm_pool.max_starting,
      maxStreamBytes: this.config.max_stdout_bytes,
      limitsFor: (jt, memoryBytes) => runLimits(host.engine, jt, memoryBytes, false),
      clock: this.clock,
      log: this.log,
      background: (q) => this.background(q),
    });
  }

  /**
   * A session's sandbox (issue 19; session/): a ready one from the session pool when there is one of
   * its job type and it asks for no requirements beyond the type's, else one started for it, by the
   * same function (session/start-session.ts). Needs cgroups and a real engine.
   */
  async openSession(jobType: JobType, o: SessionOpenOptions): Promise<SessionSandbox> {
    const p = this.p;
    if (!p) throw new Error('local runtime is not started');
    const pooled = this.sessionPool?.take(jobType, o.requirements ?? [], o.maxStreamBytes, this.config.max_stdout_bytes);
    return pooled ?? startSessionSandbox(this.ctx, p, jobType, o);
  }

  sessionPoolStats(): SessionPoolStats[] {
    return this.sessionPool?.stats() ?? [];
  }

  async prewarm(jobType: JobType, size = 1, requirements: readonly string[] = jobType.requirements): Promise<void> {
    const p = this.p;
    if (!p) throw new Error('local runtime is not started');
    const interpreter = this.config.python_interpreters[jobType.pythonVersion];
    if (!interpreter) throw new Error(`no interpreter configured for python ${jobType.pythonVersion}`);
    if (!p.sandboxes && p.cgroups && p.spawner && p.engine !== 'process') p.sandboxes = this.newPool(p.cgroups, p.spawner, p.host, p.runsDir, [], new Map());
    if (!p.sandboxes) throw new Error('warm sandboxes need cgroups (root) and an isolating engine');
    const env = warmEnvFor(this.envSources(p.deps), jobType, requirements, interpreter);
    if (!env) throw new Error(`the environment of job type ${jobType.name} is not installed or built yet: run it once (cold) or build it first`);
    await p.sandboxes.ensure({ jobType, interpreter, size, env });
  }

  warmPoolStats(): WarmPoolStats[] {
    return this.p?.sandboxes?.stats() ?? [];
  }

  async stop(): Promise<void> {
    this.reservations.clear();
    this.p?.warm?.stop();
    await this.p?.sandboxes?.stop();
    await this.sessionPool?.stop();
    this.sessionPool = null;
    // Warm sandboxes of ended runs still waiting for their teardown go now (the stopped pool refills nothing).
    for (const t of [...this.teardowns]) t();
    await Promise.allSettled([...this.cleanups]);
    const p = this.p;
    this.p = null;
    if (!p) return;
    await p.spawner?.stop();
    await p.cgroups?.release();
    await releaseRunsDir(p.runsDir, p.runsTmpfs);
    releaseWorkspace(this.root);
  }

  async health(): Promise<RuntimeHealth> {
    const p = this.p;
    return {
      available: p !== null,
      // Proven when gVisor was probed; otherwise "installed" is the best we know without starting one.
      gvisorAvailable: this.gvisorWorks || (this.bins.runsc !== null && this.probeErrors.gvisor === undefined),
      engine: p?.engine ?? 'none',
      isolated: p !== null && p.engine !== 'process',
      limits: p?.cgroups ? 'cgroups' : 'rlimits',
      detail: {
        security_mode: this.config.security_mode,
        cgroup_version: p?.cgroups?.version ?? null,
        seccomp: this.config.enable_seccomp && p?.engine !== 'process',
        gvisor_platform: this.config.gvisor_platform,
        runs_on_tmpfs: p?.runsTmpfs ?? false,
        ...(Object.keys(this.probeErrors).length ? { unavailable_engines: { ...this.probeErrors } } : {}),
      },
    };
  }

  /**
   * One run: prepare the directory, the requirements and the egress proxy (startup), place it in
   * cgroups, start the runner and supervise it, then read what it left. A step that ends the run early
   * returns the observation so far; everything of the run is removed in the background afterwards.
   */
  async run(spec: RunSpec, options: RunOptions = {}): Promise<RawRun> {
    if (options.adopt) throw new RunGoneError(`local runs cannot be re-attached (execution ${spec.executionId})`);
    const p = this.p;
    if (!p) throw new Error('local runtime is not started');
    const t0 = this.clock.now();
    const obs = baseObservation(t0, { oomDetectable: p.cgroups !== null });
    if (options.signal?.aborted) return finish(this.clock, obs, t0, { cancelled: true });
    const interpreter = this.config.python_interpreters[spec.jobType.pythonVersion];
    if (!interpreter) {
      return finish(this.clock, obs, t0, { infraError: { type: 'config_error', message: `no interpreter configured for python ${spec.jobType.pythonVersion} (python_interpreters)` } });
    }
    const memoryBytes = parseMemory(spec.jobType.memoryLimit);
    const env = p.sandboxes ? this.warmEnv(p, spec, interpreter) : null;
    const reserved = this.reservations.take(spec, interpreter, env);
    if (reserved) return runWarm(this.ctx, this.teardowns, spec, options, p, t0, obs, reserved);
    const claimed = p.sandboxes?.claim(spec.jobType, interpreter, env) ?? null;
    if (claimed && this.reservations.deliver(claimed, spec)) return runWarm(this.ctx, this.teardowns, spec, options, p, t0, obs, claimed);
    const rd = RunDir.create({ host: p.host, runsDir: p.runsDir, id: sandboxId(null, t0), program: { code: spec.code, inputJson: spec.inputJson, inputFiles: spec.inputFiles }, tmpBytes: memoryBytes });
    obs.warm = false;
    const s: RunState = { spec, options, p, interpreter, t0, obs, rd, depsDir: null, egress: null, warm: null, cgroup: null };
    try {
      const early = (await prepareRequirements(this.ctx, s)) ?? (await openEgress(this.ctx, s));
      if (early) return finish(this.clock, obs, t0, early);
      placeInCgroups(s, memoryBytes);
      const { res, launch } = await execute(this.ctx, s, memoryBytes);
      observe(this.clock, s, res);
      const raw = finish(this.clock, obs, t0, {}, collectRun(rd.outputDir, res, obs, spec));
      if (res.killedBy && launch.runscId) this.background(runscDelete(this.bins.runsc!, p.host.runscState, [launch.runscId]));
      return raw;
    } finally {
      await s.egress?.close();
      // After the result is handed back: none of this is on the run's critical path.
      const cg = s.cgroup;
      this.background(
        new Promise((r) => setImmediate(r)).then(async () => {
          await cg?.remove();
          rd.remove();
        }),
      );
      setImmediate(() => this.p?.warm?.refill());
      // A cold start that installed (or materialized) the run's environment: later runs find it warm.
      if (s.depsDir && p.sandboxes) {
        const env = this.warmEnv(p, spec, interpreter);
        if (env) p.sandboxes.learn(spec.jobType, interpreter, env);
        setImmediate(() => this.p?.sandboxes?.tick());
      }
    }
  }

  /**
   * While the run's record is being written: claims a warm sandbox for it and writes the program in,
   * so `run` only has to say go (pool/reservations.ts). Nothing runs here.
   */
  reserve(spec: RunSpec): void {
    const interpreter = this.config.python_interpreters[spec.jobType.pythonVersion];
    const p = this.p;
    if (p && interpreter) this.reservations.reserve(spec, interpreter, this.warmEnv(p, spec, interpreter));
  }

  /** Destroys a reserved sandbox its run did not take (it ran nothing). */
  unreserve(executionId: string): void {
    this.reservations.unreserve(executionId);
  }

  private installContext(p: Prepared): InstallContext {
    return { host: p.host, cgroups: p.cgroups, runsDir: p.runsDir, pip: this.config.pip, runsc: this.bins.runsc, clock: this.clock, log: this.log, background: (q) => this.background(q) };
  }

  private background(p: Promise<unknown>): void {
    const q = p.then(
      () => undefined,
      (err: unknown) => this.log.warn({ err }, 'local runtime cleanup failed'),
    );
    this.cleanups.add(q);
    void q.finally(() => this.cleanups.delete(q));
  }
}
