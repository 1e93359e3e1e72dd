/**
 * The local runtime: runs each job in a sandbox on this machine with gVisor (`runsc`), bubblewrap
 * (`bwrap`) or, in `permissive` mode only, a plain process. This file is the runtime's life cycle
 * (start, stop, health) and one run as a sequence of steps; each step's machinery lives beside it:
 * `workspace.ts` (claim, runs directory), `engine-probe.ts` (engine choice), `run-dir.ts` (a run's
 * directory and mounts), `deps.ts` (requirements), `egress-proxy.ts`, `warm-pool.ts`, `cgroups.ts`,
 * `runner-command.ts`, `sandbox.ts` (the engine's command), `proc.ts` (spawn and deadline),
 * `collect.ts` (what the run left).
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
import { baseObservation, emptyRun, RUNNER_TIMEOUT_EXIT } from '../run-output.ts';
import { RunGoneError, type RawRun, type RunObservation, type RunOptions, type RunSpec, type Runtime, type RuntimeHealth, type WarmPoolStats } from '../runtime.ts';
import { detectCgroups, type CgroupLimits, type CgroupSupport, type RunCgroup } from './cgroups.ts';
import { builtEnvironmentStep, LocalBuilder } from './builds/build.ts';
import { collectRun } from './runs/collect.ts';
import { DepsCache, prepareRequirements } from './builds/deps.ts';
import { sandboxInstaller, type InstallContext } from './builds/install-sandbox.ts';
import { EgressProxy } from './runs/egress-proxy.ts';
import { chooseEngine, defaultInterpreter } from './engine-probe.ts';
import { findEngineBinaries, type EngineBinaries, type EngineName } from './engines.ts';
import { runscDelete, superviseLaunch, type LaunchResult } from './runs/proc.ts';
import { RunDir, sandboxId } from './runs/run-dir.ts';
import { runnerSandbox } from './runs/runner-command.ts';
import { EGRESS_DIR, SandboxHost, WRAPPER_FAILED_EXIT } from './sandbox.ts';
import { poolKey, SandboxPool, type PoolTarget, type WarmSandbox } from './pool/sandbox-pool.ts';
import { Spawner } from './spawner.ts';
import { WarmPool, type Warm } from './pool/warm-pool.ts';
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
  prewarm(jobType: JobType, size?: number): Promise<void>;
  reserve(spec: RunSpec): void;
  unreserve(executionId: string): void;
  warmPoolStats(): WarmPoolStats[];
}

/** Longest Unix socket path Linux takes (sun_path is 108 bytes with its NUL). */
const MAX_UNIX_PATH = 107;
/** Most warm processes kept, whatever max_workers says. */
const MAX_WARM = 8;
/** How long after a warm run its sandbox's teardown and the pool's refill wait (see runWarm), ms. */
const WARM_TEARDOWN_DELAY_MS = 10;
/** A reserved warm sandbox whose run did not come within this long is given back (destroyed), ms. */
const RESERVATION_TTL_MS = 10_000;

/** A warm sandbox claimed, and loaded with the program, while the run's record is being written. */
interface Reservation {
  w: WarmSandbox;
  key: string;
  code: string;
  inputJson: string;
  timer: NodeJS.Timeout;
}

/**
 * Creates the local runtime. Nothing happens until `start()`, which picks the engine
 * (`sandbox_engine`, `security_mode`), proves it works by running a sandbox, and removes what earlier
 * runs of this workspace left behind. `start()` throws when no allowed engine works — in `strict`
 * mode that means gVisor is missing or broken.
 */
export function createLocalRuntime(config: Config, options: LocalRuntimeOptions = {}): LocalRuntime {
  return new LocalRuntimeImpl(config, options.logger ?? silentLogger, options.clock ?? systemClock);
}

/** What start() prepared; null before start and after stop. */
interface Prepared {
  engine: EngineName;
  host: SandboxHost;
  cgroups: CgroupSupport | null;
  deps: DepsCache;
  runsDir: string;
  runsTmpfs: boolean;
  /** Forks the warm children (with cgroups only: they exist to enter a run's cgroups early). */
  spawner: Spawner | null;
  warm: WarmPool | null;
  /** Warm sandboxes per job type (with cgroups and a real engine only; see sandbox-pool.ts). */
  sandboxes: SandboxPool | null;
}

/** One run's state between the steps of {@link LocalRuntimeImpl.run}. */
interface RunState {
  spec: RunSpec;
  options: RunOptions;
  p: Prepared;
  interpreter: string;
  t0: number;
  obs: RunObservation;
  rd: RunDir;
  depsDir: string | null;
  egress: EgressProxy | null;
  warm: Warm | null;
  cgroup: RunCgroup | null;
}

class LocalRuntimeImpl implements LocalRuntime {
  readonly name = 'local';
  private p: Prepared | null = null;
  private readonly bins: EngineBinaries;
  private readonly root: string;
  private readonly instance: string;
  private readonly cleanups = new Set<Promise<void>>();
  /** Teardowns of warm sandboxes whose runs ended, waiting out WARM_TEARDOWN_DELAY_MS. */
  private readonly teardowns = new Set<() => void>();
  /** Warm sandboxes reserved for runs whose records are being written, by execution id. */
  private readonly reservations = new Map<string, Reservation>();
  private readonly probeErrors: Partial<Record<EngineName, string>> = {};
  private gvisorWorks = false;
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
    const sandboxes = cgroups && spawner && engine !== 'process' ? this.sandboxPool(cgroups, spawner, host, runsDir) : null;
    this.p = { engine, host, cgroups, deps, runsDir, runsTmpfs, spawner, warm, sandboxes };
    warm?.refill();
    sandboxes?.tick();
    this.log.info(
      { engine, limits: cgroups ? `cgroups-v${cgroups.version}` : 'rlimits', orphan_cgroups: orphans, runs_tmpfs: runsTmpfs },
      engine === 'process' ? 'local runtime started WITHOUT isolation (process engine)' : 'local runtime started',
    );
  }

  /** The warm sandbox pool of `warm_pool.sizes` (job types from the config file, as the service's registry). */
  private sandboxPool(cgroups: CgroupSupport, spawner: Spawner, host: SandboxHost, runsDir: string): SandboxPool | null {
    const registry = new FileJobTypeRegistry(this.config);
    const targets: PoolTarget[] = [];
    for (const [name, size] of Object.entries(warmPoolSizes(this.config))) {
      const jobType = registry.get(name);
      const interpreter = jobType ? this.config.python_interpreters[jobType.pythonVersion] : undefined;
      if (!jobType || !interpreter) {
        this.log.warn({ job_type: name }, 'warm_pool.sizes names an unknown job type (or one without an interpreter): not kept warm');
        continue;
      }
      if (jobType.requirements.length > 0 || jobType.network.allowedHosts.length > 0) {
        this.log.info({ job_type: name }, 'job types with requirements or allowed_hosts start cold: not kept warm');
        continue;
      }
      if (size > 0) targets.push({ jobType, interpreter, size });
    }
    return targets.length === 0 ? null : this.newPool(cgroups, spawner, host, runsDir, targets);
  }

  private newPool(cgroups: CgroupSupport, spawner: Spawner, host: SandboxHost, runsDir: string, targets: PoolTarget[]): SandboxPool {
    return new SandboxPool({
      cgroups,
      spawner,
      host,
      runsDir,
      runsc: this.bins.runsc,
      targets,
      maxIdleMs: this.config.warm_pool.max_idle_sec * 1000,
      maxStarting: this.config.warm_pool.max_starting,
      maxStreamBytes: this.config.max_stdout_bytes,
      limitsFor: (jt, memoryBytes) => this.limits(host.engine, jt, memoryBytes, false),
      clock: this.clock,
      log: this.log,
      background: (q) => this.background(q),
    });
  }

  async prewarm(jobType: JobType, size = 1): Promise<void> {
    const p = this.p;
    if (!p) throw new Error('local runtime is not started');
    const interpreter = this.config.python_interpreters[jobType.pythonVersion];
    if (!interpreter) throw new Error(`no interpreter configured for python ${jobType.pythonVersion}`);
    if (!p.sandboxes && p.cgroups && p.spawner && p.engine !== 'process') p.sandboxes = this.newPool(p.cgroups, p.spawner, p.host, p.runsDir, []);
    if (!p.sandboxes) throw new Error('warm sandboxes need cgroups (root) and an isolating engine');
    await p.sandboxes.ensure({ jobType, interpreter, size });
  }

  warmPoolStats(): WarmPoolStats[] {
    return this.p?.sandboxes?.stats() ?? [];
  }

  async stop(): Promise<void> {
    for (const id of [...this.reservations.keys()]) this.unreserve(id);
    this.p?.warm?.stop();
    await this.p?.sandboxes?.stop();
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
    if (options.signal?.aborted) return this.finish(obs, t0, { cancelled: true });
    const interpreter = this.config.python_interpreters[spec.jobType.pythonVersion];
    if (!interpreter) {
      return this.finish(obs, t0, { infraError: { type: 'config_error', message: `no interpreter configured for python ${spec.jobType.pythonVersion} (python_interpreters)` } });
    }
    const memoryBytes = parseMemory(spec.jobType.memoryLimit);
    const reserved = this.takeReservation(spec, interpreter);
    if (reserved) return this.runWarm(spec, options, p, t0, obs, reserved);
    const claimed = p.sandboxes?.claim(spec.jobType, interpreter, spec.requirements) ?? null;
    if (claimed && this.deliver(claimed, spec)) return this.runWarm(spec, options, p, t0, obs, claimed);
    const rd = RunDir.create({ host: p.host, runsDir: p.runsDir, id: sandboxId(null, t0), program: { code: spec.code, inputJson: spec.inputJson }, tmpBytes: memoryBytes });
    const s: RunState = { spec, options, p, interpreter, t0, obs, rd, depsDir: null, egress: null, warm: null, cgroup: null };
    try {
      const early = (await this.prepareRequirements(s)) ?? (await this.openEgress(s));
      if (early) return this.finish(obs, t0, early);
      this.placeInCgroups(s, memoryBytes);
      const { res, launch } = await this.execute(s, memoryBytes);
      this.observe(s, res);
      const raw = this.finish(obs, t0, {}, collectRun(rd.outputDir, res, obs, spec));
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
    }
  }

  /**
   * While the run's record is being written: claims a warm sandbox for it and writes the program in,
   * so `run` only has to say go. Nothing runs here. A miss is not counted (the run's own claim is).
   */
  reserve(spec: RunSpec): void {
    const p = this.p;
    const interpreter = this.config.python_interpreters[spec.jobType.pythonVersion];
    if (!p?.sandboxes || !interpreter || this.reservations.has(spec.executionId)) return;
    const w = p.sandboxes.claim(spec.jobType, interpreter, spec.requirements, false);
    if (!w || !this.deliver(w, spec)) return;
    const timer = setTimeout(() => this.unreserve(spec.executionId), RESERVATION_TTL_MS);
    timer.unref();
    this.reservations.set(spec.executionId, { w, key: poolKey(spec.jobType, interpreter), code: spec.code, inputJson: spec.inputJson, timer });
  }

  /** Destroys a reserved sandbox its run did not take (it ran nothing). */
  unreserve(executionId: string): void {
    const r = this.reservations.get(executionId);
    if (!r) return;
    this.reservations.delete(executionId);
    clearTimeout(r.timer);
    this.background(r.w.destroy());
    setImmediate(() => this.p?.sandboxes?.tick());
  }

  /** The sandbox reserved for this run, with this run's program in it; null when there is none (or it no longer fits). */
  private takeReservation(spec: RunSpec, interpreter: string): WarmSandbox | null {
    const r = this.reservations.get(spec.executionId);
    if (!r) return null;
    this.reservations.delete(spec.executionId);
    clearTimeout(r.timer);
    if (r.key !== poolKey(spec.jobType, interpreter)) {
      this.background(r.w.destroy());
      setImmediate(() => this.p?.sandboxes?.tick());
      return null;
    }
    if (r.code !== spec.code || r.inputJson !== spec.inputJson) return this.deliver(r.w, spec) ? r.w : null;
    return r.w;
  }

  /**
   * Writes the program and input into a claimed warm sandbox's run directory. When that fails (its
   * directory is gone or its disk full), the sandbox is destroyed and the run starts cold instead:
   * a broken warm sandbox is a miss, never the run's failure.
   */
  private deliver(w: WarmSandbox, spec: RunSpec): boolean {
    try {
      w.rd.writeProgram({ code: spec.code, inputJson: spec.inputJson });
      return true;
    } catch (err) {
      this.log.warn({ execution_id: spec.executionId, err: String(err) }, 'warm sandbox unusable; starting the run cold');
      this.background(w.destroy());
      setImmediate(() => this.p?.sandboxes?.tick());
      return false;
    }
  }

  /**
   * A run on a claimed warm sandbox: the program and input go into its run directory, the go line
   * down its stdin; from the runner's `execution` marker the run is supervised as a cold one, and
   * its `done` line ends it: the cgroup is killed, the output collected, and the sandbox destroyed
   * in the background (the engine's teardown is not waited for).
   */
  private async runWarm(spec: RunSpec, options: RunOptions, p: Prepared, t0: number, obs: RunObservation, w: WarmSandbox): Promise<RawRun> {
    const s: RunState = { spec, options, p, interpreter: '', t0, obs, rd: w.rd, depsDir: null, egress: null, warm: null, cgroup: w.cgroup };
    try {
      w.go(spec.timeoutSec, spec.maxStdoutBytes);
      const res = await superviseLaunch(null, {
        clock: this.clock,
        startupDeadline: t0 + spec.startupTimeoutSec * 1000,
        timeoutMs: spec.timeoutSec * 1000,
        signal: options.signal,
        onExecution: () => {
          obs.phase = 'execution';
          options.onPhase?.('execution');
        },
        kill: () => w.cgroup.killAll(),
        started: w.proc,
        doneMarker: true,
        framed: true,
        onOutput: options.onOutput,
      });
      // Stopped, not killed: the sandbox's teardown waits (below) until the run is recorded.
      this.observe(s, res, 'stop');
      // The cgroup's counter includes the sandbox's own start, before the claim.
      if (obs.cpuTimeMs !== undefined) obs.cpuTimeMs = Math.max(0, obs.cpuTimeMs - w.cpuBeforeMs);
      return this.finish(obs, t0, {}, collectRun(w.rd.outputDir, res, obs, spec));
    } finally {
      // The teardown and the refill start a moment later: both take CPU (process kills, cgroup and
      // directory removal, a new sandbox's start) that the run's record and answer would otherwise
      // wait for on a small machine. The sandbox's processes were its program's; its outputs are in.
      const teardown = () => {
        clearTimeout(later);
        this.teardowns.delete(teardown);
        this.background(w.destroy());
        p.sandboxes?.tick();
      };
      const later = setTimeout(teardown, WARM_TEARDOWN_DELAY_MS);
      this.teardowns.add(teardown);
    }
  }

  /** Startup step: the requirements' environment, mounted at `/deps`; or how the run ends. */
  private async prepareRequirements(s: RunState): Promise<Partial<RunObservation> | undefined> {
    const { p, spec } = s;
    if (spec.requirements.length === 0) return undefined;
    s.options.onPhase?.('installing');
    const deadline = s.t0 + spec.startupTimeoutSec * 1000;
    // A built job type: its pinned environment, nothing installed (production_mode refuses installs).
    const built = await builtEnvironmentStep(this.builder, this.config, spec, this.clock, deadline, s.options.signal);
    const key = { interpreter: s.interpreter, pythonVersion: spec.jobType.pythonVersion, pip: this.config.pip };
    const r = built.handled ? built : await prepareRequirements(p.deps, spec.requirements, key, sandboxInstaller(this.installContext(p), s.interpreter), deadline, s.options.signal);
    s.obs.depInstallMs = r.installMs;
    if (r.end) return r.end;
    s.depsDir = r.depsDir;
    if (r.depsDir) s.rd.mount({ type: 'ro', src: r.depsDir, dest: '/deps' });
    return undefined;
  }

  private installContext(p: Prepared): InstallContext {
    return { host: p.host, cgroups: p.cgroups, runsDir: p.runsDir, pip: this.config.pip, runsc: this.bins.runsc, clock: this.clock, log: this.log, background: (q) => this.background(q) };
  }

  /**
   * Startup step: a bridge type that lists allowed_hosts gets no network of its own, only this run's
   * proxy, which lets those hosts through (see egress-proxy.ts). The process engine isolates nothing.
   */
  private async openEgress(s: RunState): Promise<Partial<RunObservation> | undefined> {
    const net = s.spec.jobType.network;
    if (net.mode !== 'bridge' || net.allowedHosts.length === 0 || s.p.engine === 'process') return undefined;
    const socketPath = path.join(s.rd.dir, 'net', 'proxy.sock');
    if (Buffer.byteLength(socketPath) > MAX_UNIX_PATH) {
      return { infraError: { type: 'config_error', message: `the workspace path is too long for the run's egress proxy socket (${socketPath}); use a shorter workspace` } };
    }
    const netDir = s.rd.subdir('net');
    const executionId = s.spec.executionId;
    s.egress = await EgressProxy.listen(socketPath, {
      allowedHosts: net.allowedHosts,
      onDecision: (d) => {
        if (!d.allowed) this.log.info({ execution_id: executionId, host: d.host, port: d.port, reason: d.reason }, 'egress refused');
      },
    });
    s.rd.mount({ type: 'ro', src: netDir, dest: EGRESS_DIR });
    return undefined;
  }

  /** Takes a warm process (and its cgroup) or creates the run's cgroups, with the job type's limits. */
  private placeInCgroups(s: RunState, memoryBytes: number): void {
    const { p, spec } = s;
    s.warm = p.warm?.take() ?? null;
    const limits = this.limits(p.engine, spec.jobType, memoryBytes, this.inProcess(s));
    if (s.warm) {
      s.cgroup = s.warm.cgroup;
      s.cgroup.setLimits(limits);
    } else {
      s.cgroup = p.cgroups?.create(s.rd.id, limits) ?? null;
    }
  }

  /** A run's cgroup limits (cold, or a warm sandbox of the job type). */
  private limits(engine: EngineName, jt: JobType, memoryBytes: number, inProcess: boolean): CgroupLimits {
    // bwrap adds one process (its outer monitor; with --as-pid-1 there is no namespace init) and the
    // runner (or its sh) one, the stream relay of an in-process run one more; user code gets the rest.
    // gVisor's sentry has host threads of its own; it enforces the count itself (RLIMIT_NPROC inside).
    const pids = engine === 'gvisor' ? jt.maxProcesses * 3 + 256 : jt.maxProcesses + (inProcess ? 3 : 2);
    return { memoryBytes, pids, cpus: jt.cpuLimit };
  }

  /**
   * With bubblewrap in a warm process, the program runs in the runner's own process (`--exec`)
   * under a `sh` that only waits for it (killing that parent ends the run, as killing a forking
   * runner does): that `sh` is the sandbox's PID 1 (non-dumpable, see SandboxHost.waitingShell),
   * passes the program's exit status on and, exiting, takes what the program left behind with it,
   * this runtime keeps the deadline, a relay in the run's cgroups caps the streams, and the cgroup
   * measures. That spares a fork of the interpreter, whose copy-on-write pages the program's exit
   * copied one by one. (Not with an egress proxy: the runner's forking parent relays the program's
   * proxy port.)
   */
  private inProcess(s: RunState): boolean {
    return s.warm !== null && s.p.engine === 'bubblewrap' && s.egress === null;
  }

  /** Starts the runner in the sandbox (in the warm process when there is one) and supervises it. */
  private async execute(s: RunState, memoryBytes: number) {
    const { p, spec, rd } = s;
    const jt = spec.jobType;
    const inProcess = this.inProcess(s);
    // A warm process is in its cgroups and has dropped privileges already.
    const sandbox = runnerSandbox({
      rd,
      interpreter: s.interpreter,
      runner: p.host.runnerFor(s.interpreter),
      jobType: jt,
      timeoutSec: spec.timeoutSec,
      maxStreamBytes: spec.maxStdoutBytes,
      memoryBytes,
      fileSizeBytes: parseMemory(jt.maxFileSize),
      deps: s.depsDir !== null,
      egress: s.egress !== null,
      cgroups: p.cgroups !== null,
      inProcess,
      sh: p.host.waitingShell(),
      procsFiles: s.cgroup?.procsFiles ?? [],
    });
    const launch = p.host.launch(sandbox, s.warm !== null);
    const res = await superviseLaunch(launch, {
      clock: this.clock,
      startupDeadline: s.t0 + spec.startupTimeoutSec * 1000,
      timeoutMs: spec.timeoutSec * 1000,
      signal: s.options.signal,
      onExecution: () => {
        s.obs.phase = 'execution';
        s.options.onPhase?.('execution');
      },
      kill: () => s.cgroup?.killAll(),
      warm: s.warm?.proc,
      // The marker line comes first on stdout; some slack for it.
      capture: inProcess ? [spec.maxStdoutBytes + 64, spec.maxStdoutBytes + 1] : undefined,
      framed: !inProcess,
      onOutput: s.options.onOutput,
    });
    return { res, launch };
  }

  /**
   * What the runtime itself saw: cgroup counters, exit, who killed it, phase times, infra errors.
   * Then whatever is left in the cgroup is killed, or (`stop`, a warm sandbox destroyed later) stopped.
   */
  private observe(s: RunState, res: LaunchResult, leftovers: 'kill' | 'stop' = 'kill'): void {
    const { obs, p, spec } = s;
    const tEnd = this.clock.now();
    if (s.cgroup) {
      const st = s.cgroup.stats();
      obs.oomKilled = st.oomKilled;
      if (st.maxRssMb !== undefined) obs.maxRssMb = Math.round(st.maxRssMb * 100) / 100;
      if (st.cpuTimeMs !== undefined) obs.cpuTimeMs = st.cpuTimeMs;
      if (leftovers === 'stop') s.cgroup.stopAll();
      else s.cgroup.killAll();
    }
    obs.exitCode = res.killedBy ? null : res.exitCode;
    if (res.killedBy === 'abort') obs.cancelled = true;
    if (res.killedBy === 'deadline') obs.timedOut = res.tExec === null ? 'startup' : 'execution';
    if (res.tExec !== null) {
      obs.startupMs = res.tExec - s.t0;
      obs.executionMs = tEnd - res.tExec;
      if (res.exitCode === RUNNER_TIMEOUT_EXIT && obs.executionMs >= spec.timeoutSec * 1000 - 250) obs.timedOut = 'execution';
    } else {
      obs.startupMs = tEnd - s.t0;
    }
    if (res.spawnError) {
      obs.infraError = { type: 'docker_error', message: `cannot start the ${p.engine} sandbox: ${res.spawnError}` };
    } else if (res.tExec === null && !res.killedBy && !obs.oomKilled) {
      const why = res.exitCode === WRAPPER_FAILED_EXIT ? 'could not enter the run cgroup' : `the sandbox exited with ${res.exitCode ?? res.signal} before user code started`;
      obs.infraError = { type: 'docker_error', message: `${p.engine}: ${why}: ${res.stderrTail.trim().slice(-2000)}` };
    }
    obs.phase = res.tExec === null ? 'startup' : obs.timedOut === 'execution' ? 'execution' : obs.exitCode === 0 ? 'completed' : 'failed';
  }

  /** Closes the observation (end time, total, startup time of a run that never left startup). */
  private finish(obs: RunObservation, t0: number, outcome: Partial<RunObservation>, produced: Omit<RawRun, 'observation'> | null = null): RawRun {
    Object.assign(obs, outcome);
    const t = this.clock.now();
    obs.endedAt = new Date(t);
    obs.totalMs = t - t0;
    if (obs.phase === 'startup') obs.startupMs = obs.totalMs;
    return produced ? { observation: obs, ...produced } : emptyRun(obs);
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
