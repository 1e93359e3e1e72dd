/**
 * The local runtime: runs each job in a sandbox on this machine with gVisor (`runsc`), bubblewrap
 * (`bwrap`) or, in `permissive` mode only, a plain process.
 *
 * One run, start to end:
 *  1. startup: the run directory is written (`code/main.py`, `input/data.json`, `output/`), requirements
 *     are made available (cached environment, or a pip install in its own sandbox), the run's cgroups
 *     are created, and the sandbox is started with `src/sandbox/runner.py` as its command;
 *  2. execution: the runner signals (on its stdout) that user code starts; the runtime's backstop
 *     deadline becomes `timeout + grace` (just `timeout` for a program run in the runner's own process,
 *     `--exec`, which bubblewrap runs from a warm process use: see run());
 *  3. the sandbox exits (or is killed by the deadline / a cancel); the runtime reads the cgroup's
 *     counters (trusted), the runner's report and streams (untrusted) and `/output`, and removes
 *     everything of the run in the background.
 *
 * Process creation: with cgroups (root), a small Python process (`spawner.py`) keeps pre-forked warm
 * children that already sit in a run's cgroups and dropped root; Node never forks itself per run.
 *
 * Layout on the host: `<workspace>/sandbox/<instance>/` with `runs/` (one directory per run; a tmpfs
 * when running as root, so what runs write is memory charged to their own cgroup, never host disk),
 * `deps/` (requirement environments and pip's cache), `rootfs/` (the gVisor root; its `etc/` is the
 * sandbox's /etc for every engine), `runner/` (a copy of runner.py readable by uid 1000), `runsc/`
 * (runsc state). `<instance>` is derived from the workspace path so two services on one machine never
 * touch each other's runs.
 */
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, closeSync, existsSync, openSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseMemory, type Config } from '../../config.ts';
import {
  RunGoneError,
  type RawRun,
  type RunObservation,
  type RunOptions,
  type RunSpec,
  type Runtime,
  type RuntimeHealth,
} from '../runtime.ts';
import { detectCgroups, type CgroupSupport, type RunCgroup } from './cgroups.ts';
import { collectOutputs, readReport, readStream } from './collect.ts';
import { DepsCache, depsKey, invalidRequirement, normalizeRequirements, type InstallOutcome } from './deps.ts';
import { candidateEngines, engineInstalled, findEngineBinaries, type EngineBinaries, type EngineName } from './engines.ts';
import { EgressProxy } from './egress-proxy.ts';
import { compileSeccompBpf } from './seccomp.ts';
import { EGRESS_DIR, SandboxHost, WRAPPER_FAILED_EXIT, type Launch, type Mount, type SandboxSpec } from './sandbox.ts';
import { Spawner, type RunProc, type SpawnedProc } from './spawner.ts';
import { coverInheritedFds, inheritedFds } from '../../util/inherited-fds.ts';

/** The runner's exit status when it killed user code for running out of time (see runner.py). */
export const RUNNER_TIMEOUT_EXIT = 124;
/** The runner's exit status when it failed itself. */
export const RUNNER_ERROR_EXIT = 125;
/** Extra time the runtime gives the runner's own timeout before its backstop kills the sandbox. */
export const EXECUTION_GRACE_MS = 1500;
/** Open files allowed to user code. */
export const SANDBOX_NOFILE = 1024;
const STDERR_TAIL = 8192;
const PIP_TAIL = 4000;
/** Absolute path of the runner shipped with this source tree. */
export const RUNNER_SOURCE = fileURLToPath(new URL('../../sandbox/runner.py', import.meta.url));

/** Minimal logger (pino-compatible). */
export interface LocalRuntimeLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
  debug?(obj: object, msg?: string): void;
}

/** Options of {@link createLocalRuntime}. */
export interface LocalRuntimeOptions {
  logger?: LocalRuntimeLogger;
}

/** The local runtime; `engine` is known after `start()`. */
export interface LocalRuntime extends Runtime {
  readonly engine: EngineName | null;
}

/** Longest Unix socket path Linux takes (sun_path is 108 bytes with its NUL). */
const MAX_UNIX_PATH = 107;

const SILENT: LocalRuntimeLogger = { info() {}, warn() {}, error() {} };

/** Directory of one instance (workspace) of the local runtime. */
export function instanceRoot(config: Pick<Config, 'workspace'>): { root: string; instance: string } {
  const ws = path.resolve(config.workspace);
  const instance = createHash('sha256').update(ws).digest('hex').slice(0, 12);
  return { root: path.join(ws, 'sandbox', instance), instance };
}

/**
 * Creates the local runtime. Nothing happens until `start()`, which picks the engine
 * (`sandbox_engine`, `security_mode`), proves it works by running a sandbox, and removes what earlier
 * runs of this workspace left behind. `start()` throws when no allowed engine works — in `strict`
 * mode that means gVisor is missing or broken.
 */
export function createLocalRuntime(config: Config, options: LocalRuntimeOptions = {}): LocalRuntime {
  return new LocalRuntimeImpl(config, options.logger ?? SILENT);
}

interface Prepared {
  engine: EngineName;
  host: SandboxHost;
  cgroups: CgroupSupport | null;
  deps: DepsCache;
  runsDir: string;
  runsTmpfs: boolean;
  /** Forks the warm children (with cgroups only: they exist to enter a run's cgroups early). */
  spawner: Spawner | null;
}

class LocalRuntimeImpl implements LocalRuntime {
  readonly name = 'local';
  private p: Prepared | null = null;
  private readonly bins: EngineBinaries;
  private readonly root: string;
  private readonly instance: string;
  private readonly cleanups = new Set<Promise<void>>();
  private readonly probeErrors: Partial<Record<EngineName, string>> = {};
  private gvisorWorks = false;
  private readonly warm: Warm[] = [];
  private readonly warmTarget: number;
  private stopping = false;

  constructor(
    private readonly config: Config,
    private readonly log: LocalRuntimeLogger,
  ) {
    this.bins = findEngineBinaries(config);
    this.warmTarget = Math.min(Math.max(config.max_workers, 1), 8);
    ({ root: this.root, instance: this.instance } = instanceRoot(config));
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
    const runsTmpfs = await this.prepareRunsDir(runsDir, cgroups);
    try {
      await this.startEngines(cgroups, runsDir, runsTmpfs);
    } catch (err) {
      if (runsTmpfs) await execOk('umount', ['-l', runsDir]);
      releaseWorkspace(this.root);
      throw err;
    }
  }

  private async startEngines(cgroups: CgroupSupport | null, runsDir: string, runsTmpfs: boolean): Promise<void> {
    const deps = new DepsCache(path.join(this.root, 'deps'), SandboxHost.ownBySandbox);
    const candidates = candidateEngines(this.config);
    if (candidates.length === 0) {
      throw new Error(`sandbox_engine ${this.config.sandbox_engine} is not allowed in security_mode ${this.config.security_mode}`);
    }
    let chosen: { engine: EngineName; host: SandboxHost } | null = null;
    for (const engine of candidates) {
      if (!engineInstalled(engine, this.bins)) {
        this.probeErrors[engine] = `${engine === 'gvisor' ? this.config.container_runtime || 'runsc' : 'bwrap'} not found`;
        continue;
      }
      const host = this.makeHost(engine);
      for (const interp of Object.values(this.config.python_interpreters)) if (existsSync(interp)) host.runnerFor(interp);
      if (engine === 'gvisor') await this.removeRunscOrphans(host);
      const err = await probe(host, runsDir, this.interpreter('3.11') ?? firstInterpreter(this.config));
      if (err === null) {
        chosen = { engine, host };
        if (engine === 'gvisor') this.gvisorWorks = true;
        break;
      }
      this.probeErrors[engine] = err;
      this.log.warn({ engine, err }, 'sandbox engine does not work here');
    }
    if (!chosen) {
      const why = Object.entries(this.probeErrors).map(([e, m]) => `${e}: ${m}`).join('; ');
      if (this.config.security_mode === 'strict') throw new Error(`security_mode strict requires gVisor (runsc), which is not usable: ${why}`);
      throw new Error(`no usable sandbox engine for sandbox_engine=${this.config.sandbox_engine}: ${why}`);
    }
    const orphans = cgroups ? await cgroups.removeOrphans() : 0;
    const spawner = cgroups ? new Spawner(this.interpreter('3.11') ?? firstInterpreter(this.config), (msg) => this.log.warn({ msg }, 'sandbox spawner')) : null;
    this.p = { engine: chosen.engine, host: chosen.host, cgroups, deps, runsDir, runsTmpfs, spawner };
    this.stopping = false;
    this.refillWarm();
    this.log.info(
      { engine: chosen.engine, limits: cgroups ? `cgroups-v${cgroups.version}` : 'rlimits', orphanCgroups: orphans, runsTmpfs },
      chosen.engine === 'process' ? 'local runtime started WITHOUT isolation (process engine)' : 'local runtime started',
    );
  }

  async stop(): Promise<void> {
    this.stopping = true;
    for (const w of this.warm.splice(0)) {
      w.proc.kill();
      this.background(w.proc.closed.then(() => w.cgroup.remove()));
    }
    await Promise.allSettled([...this.cleanups]);
    const p = this.p;
    this.p = null;
    await p?.spawner?.stop();
    await p?.cgroups?.release();
    if (p?.runsTmpfs) await execOk('umount', ['-l', p.runsDir]);
    if (p) releaseWorkspace(this.root);
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
        securityMode: this.config.security_mode,
        cgroupVersion: p?.cgroups?.version ?? null,
        seccomp: this.config.enable_seccomp && p?.engine !== 'process',
        gvisorPlatform: this.config.gvisor_platform,
        runsOnTmpfs: p?.runsTmpfs ?? false,
        ...(Object.keys(this.probeErrors).length ? { unavailableEngines: { ...this.probeErrors } } : {}),
      },
    };
  }

  async run(spec: RunSpec, options: RunOptions = {}): Promise<RawRun> {
    if (options.adopt) throw new RunGoneError(`local runs cannot be re-attached (execution ${spec.executionId})`);
    const p = this.p;
    if (!p) throw new Error('local runtime is not started');
    const t0 = Date.now();
    const obs: RunObservation = {
      exitCode: null,
      timedOut: null,
      oomKilled: false,
      oomDetectable: p.cgroups !== null,
      cancelled: false,
      dependencyError: null,
      infraError: null,
      phase: 'startup',
      startedAt: new Date(t0),
      endedAt: new Date(t0),
      startupMs: 0,
      depInstallMs: 0,
      executionMs: 0,
      totalMs: 0,
    };
    const finish = (extra: Partial<RawRun> = {}): RawRun => {
      const t = Date.now();
      obs.endedAt = new Date(t);
      obs.totalMs = t - t0;
      if (obs.phase === 'startup') obs.startupMs = obs.totalMs;
      return { observation: obs, report: null, stdout: '', stderr: '', stdoutTruncated: false, stderrTruncated: false, resultJson: null, artifacts: [], ...extra };
    };
    if (options.signal?.aborted) {
      obs.cancelled = true;
      return finish();
    }
    const jt = spec.jobType;
    const interpreter = this.interpreter(jt.pythonVersion);
    if (!interpreter) {
      obs.infraError = { type: 'config_error', message: `no interpreter configured for python ${jt.pythonVersion} (python_interpreters)` };
      return finish();
    }
    const runId = `sp-${t0.toString(36)}-${randomBytes(5).toString('hex')}`;
    const dir = path.join(p.runsDir, runId);
    const startupDeadline = t0 + spec.startupTimeoutSec * 1000;
    let cgroup: RunCgroup | null = null;
    let egress: EgressProxy | null = null;
    try {
      mkdirSync(path.join(dir, 'code'), { recursive: true, mode: 0o755 });
      mkdirSync(path.join(dir, 'input'), { mode: 0o755 });
      mkdirSync(path.join(dir, 'output'), { mode: 0o755 });
      writeFileSync(path.join(dir, 'code', 'main.py'), spec.code, { mode: 0o644 });
      writeFileSync(path.join(dir, 'input', 'data.json'), spec.inputJson, { mode: 0o644 });
      SandboxHost.ownBySandbox(path.join(dir, 'output'));
      if (p.engine === 'process') {
        mkdirSync(path.join(dir, 'tmp'), { mode: 0o700 });
        SandboxHost.ownBySandbox(path.join(dir, 'tmp'));
      }

      // Requirements (startup phase).
      let depsDir: string | null = null;
      const reqs = normalizeRequirements(spec.requirements);
      if (reqs.length > 0) {
        const bad = invalidRequirement(reqs);
        if (bad) {
          obs.dependencyError = bad;
          return finish();
        }
        const key = depsKey(interpreter, jt.pythonVersion, reqs, this.config.pip);
        const r = await p.deps.ensure(key, reqs, (target, rq, deadline, signal) => this.install(p, interpreter, target, rq, deadline, signal), startupDeadline, options.signal);
        obs.depInstallMs = r.installMs;
        if (r.kind === 'cancelled') {
          obs.cancelled = true;
          return finish();
        }
        if (r.kind === 'timeout') {
          obs.timedOut = 'startup';
          return finish();
        }
        if (r.kind === 'failed') {
          obs.dependencyError = r.message || 'pip failed without output';
          return finish();
        }
        depsDir = r.dir;
      }

      // A bridge type that lists allowed_hosts gets no network of its own, only this run's proxy,
      // which lets those hosts through (see egress-proxy.ts). The process engine isolates nothing.
      if (jt.network.mode === 'bridge' && jt.network.allowedHosts.length > 0 && p.engine !== 'process') {
        const socketPath = path.join(dir, 'net', 'proxy.sock');
        if (Buffer.byteLength(socketPath) > MAX_UNIX_PATH) {
          obs.infraError = { type: 'config_error', message: `the workspace path is too long for the run's egress proxy socket (${socketPath}); use a shorter workspace` };
          return finish();
        }
        mkdirSync(path.join(dir, 'net'), { mode: 0o755 });
        const executionId = spec.executionId;
        egress = await EgressProxy.listen(socketPath, {
          allowedHosts: jt.network.allowedHosts,
          onDecision: (d) => {
            if (!d.allowed) this.log.info({ execution_id: executionId, host: d.host, port: d.port, reason: d.reason }, 'egress refused');
          },
        });
      }

      const memoryBytes = parseMemory(jt.memoryLimit);
      const fsize = parseMemory(jt.maxFileSize);
      const warm = this.takeWarm();
      // With bubblewrap in a warm process, the program runs in the runner's own process (`--exec`)
      // under a `sh` that only waits for it (killing that parent ends the run, as killing a forking
      // runner does): bwrap's namespace init passes its exit status on and kills what it left behind,
      // this runtime keeps the deadline, a relay in the run's cgroups caps the streams, and the cgroup
      // measures. That spares a fork of the interpreter, whose copy-on-write pages the program's exit
      // copied one by one.
      // (Not with an egress proxy: the runner's forking parent relays the program's proxy port.)
      const inProcess = warm !== null && p.engine === 'bubblewrap' && egress === null;
      // bwrap adds two processes (outer monitor, namespace init) and the runner (or its sh) one, the
      // stream relay of an in-process run one more; user code gets the rest.
      // gVisor's sentry has host threads of its own; it enforces the count itself (RLIMIT_NPROC inside).
      const pidsForHost = p.engine === 'gvisor' ? jt.maxProcesses * 3 + 256 : jt.maxProcesses + (inProcess ? 4 : 3);
      const limits = { memoryBytes, pids: pidsForHost, cpus: jt.cpuLimit };
      if (warm) {
        cgroup = warm.cgroup;
        cgroup.setLimits(limits);
      } else {
        cgroup = p.cgroups?.create(runId, limits) ?? null;
      }

      const mounts: Mount[] = [
        { type: 'ro', src: path.join(dir, 'code'), dest: '/code' },
        { type: 'ro', src: path.join(dir, 'input'), dest: '/input' },
        { type: 'rw', src: path.join(dir, 'output'), dest: '/output' },
        p.engine === 'process' ? { type: 'rw', src: path.join(dir, 'tmp'), dest: '/tmp' } : { type: 'tmpfs', dest: '/tmp', sizeBytes: memoryBytes },
      ];
      if (depsDir) mounts.push({ type: 'ro', src: depsDir, dest: '/deps' });
      if (egress) mounts.push({ type: 'ro', src: path.join(dir, 'net'), dest: EGRESS_DIR });
      const at = (d: string) => p.host.insidePath({ mounts }, d);
      const env = programEnv(depsDir ? [at('/deps')] : [], jt.env, p.engine === 'process' ? at('/tmp') : '/tmp');
      const argv = [
        // sh stays the waiting parent (`; exit $?`); its own stderr goes nowhere (it would say "Killed"
        // when the program dies by a signal), the program (exec'd in a subshell) gets the real one.
        ...(inProcess ? [this.bins.sh, '-c', 'exec 9>&2 2>/dev/null; (exec "$@" 2>&9 9>&-); exit $?', 'sh'] : []),
        interpreter,
        at(p.host.runnerFor(interpreter)),
        '--code', at('/code/main.py'),
        '--input', at('/input/data.json'),
        '--output', at('/output'),
        '--timeout', String(spec.timeoutSec),
        '--max-stream-bytes', String(spec.maxStdoutBytes),
        '--phase-fd', '1',
        ...(inProcess ? ['--exec'] : []),
        '--rlimit', `fsize=${fsize}`,
        '--rlimit', `nofile=${SANDBOX_NOFILE}`,
        '--rlimit', 'core=0',
        // Without cgroups: the process count can only be bounded per uid, memory by address space
        // (exceeding it raises MemoryError instead of a SIGKILL), CPU not at all.
        ...(p.cgroups ? [] : ['--rlimit', `nproc=${jt.maxProcesses}`, '--rlimit', `as=${memoryBytes}`]),
        ...(depsDir ? ['--python-path', at('/deps')] : []),
        ...(egress ? ['--egress-proxy', `${EGRESS_DIR}/proxy.sock`] : []),
        ...Object.entries(jt.env).map(([k, v]) => `--env=${k}=${v}`),
      ];
      if (p.engine === 'process') argv.push('--cwd', at('/tmp'), '--tmp', at('/tmp'));
      const sb: SandboxSpec = {
        id: runId,
        dir,
        argv,
        env,
        cwd: '/tmp',
        mounts,
        network: jt.network.mode === 'bridge' && egress === null,
        ...(egress ? { hostSockets: true } : {}),
        rlimits: { fsize, nofile: SANDBOX_NOFILE, nproc: jt.maxProcesses },
        procsFiles: cgroup?.procsFiles ?? [],
      };
      // A warm process is in its cgroups and has dropped privileges already.
      const launch = p.host.launch(sb, warm !== null);
      const res = await this.execute(launch, {
        startupDeadline,
        timeoutMs: spec.timeoutSec * 1000,
        signal: options.signal,
        onExecution: () => {
          obs.phase = 'execution';
          options.onPhase?.('execution');
        },
        kill: () => cgroup?.killAll(),
        warm: warm?.proc,
        // The marker line comes first on stdout; some slack for it.
        capture: inProcess ? [spec.maxStdoutBytes + 64, spec.maxStdoutBytes + 1] : undefined,
      });
      const tEnd = Date.now();
      if (cgroup) {
        const st = cgroup.stats();
        obs.oomKilled = st.oomKilled;
        if (st.maxRssMb !== undefined) obs.maxRssMb = Math.round(st.maxRssMb * 100) / 100;
        if (st.cpuTimeMs !== undefined) obs.cpuTimeMs = st.cpuTimeMs;
        cgroup.killAll();
      }
      obs.exitCode = res.killedBy ? null : res.exitCode;
      if (res.killedBy === 'abort') obs.cancelled = true;
      if (res.killedBy === 'deadline') obs.timedOut = res.tExec === null ? 'startup' : 'execution';
      if (res.tExec !== null) {
        obs.startupMs = res.tExec - t0;
        obs.executionMs = tEnd - res.tExec;
        if (res.exitCode === RUNNER_TIMEOUT_EXIT && obs.executionMs >= spec.timeoutSec * 1000 - 250) obs.timedOut = 'execution';
      } else {
        obs.startupMs = tEnd - t0;
      }
      if (res.spawnError) {
        obs.infraError = { type: 'docker_error', message: `cannot start the ${p.engine} sandbox: ${res.spawnError}` };
      } else if (res.tExec === null && !res.killedBy && !obs.oomKilled) {
        const why = res.exitCode === WRAPPER_FAILED_EXIT ? 'could not enter the run cgroup' : `the sandbox exited with ${res.exitCode ?? res.signal} before user code started`;
        obs.infraError = { type: 'docker_error', message: `${p.engine}: ${why}: ${res.stderrTail.trim().slice(-2000)}` };
      }
      const out = path.join(dir, 'output');
      obs.phase =
        res.tExec === null ? 'startup' : obs.timedOut === 'execution' ? 'execution' : obs.exitCode === 0 ? 'completed' : 'failed';
      let report = res.tExec !== null ? readReport(out) : null;
      let stdout: { text: string; truncated: boolean };
      let stderr: { text: string; truncated: boolean };
      if (res.captured) {
        // What the runner would have reported, from what this runtime saw; the runner only wrote the
        // exception of an uncaught one (untrusted, like every report).
        const c = res.captured;
        const marker = c.stdout.indexOf('execution\n');
        const userOut = marker >= 0 ? c.stdout.subarray(marker + 'execution\n'.length) : Buffer.alloc(0);
        stdout = capped(userOut, spec.maxStdoutBytes);
        stderr = capped(c.stderr, spec.maxStdoutBytes);
        const signaled = res.exitCode !== null && res.exitCode > 128;
        // A signal death leaves no report: nothing survived the program to write one (as when a
        // forking runner is killed), and the runtime's own observation says all there is.
        report =
          res.tExec === null || signaled || res.exitCode === null
            ? null
            : {
                phase: obs.phase,
                exit_code: res.exitCode === null || signaled ? null : res.exitCode,
                signal: signaled ? res.exitCode! - 128 : null,
                exception: report?.exception ?? null,
                exception_mro: report?.exception_mro ?? null,
                missing_module: report?.missing_module ?? null,
                exception_message: report?.exception_message ?? null,
                execution_ms: obs.executionMs,
                stdout_truncated: stdout.truncated,
                stderr_truncated: stderr.truncated,
                timed_out: obs.timedOut === 'execution',
              };
      } else {
        stdout = readStream(out, '.svc_stdout', spec.maxStdoutBytes);
        stderr = readStream(out, '.svc_stderr', spec.maxStdoutBytes);
      }
      const collected = collectOutputs(out, spec.maxArtifactBytes);
      const raw = finish({
        report,
        stdout: stdout.text,
        stderr: stderr.text,
        stdoutTruncated: stdout.truncated || report?.stdout_truncated === true,
        stderrTruncated: stderr.truncated || report?.stderr_truncated === true,
        resultJson: collected.resultJson,
        ...(collected.resultJsonTooLarge ? { resultJsonTooLarge: true } : {}),
        artifacts: collected.artifacts,
      });
      if (res.tExec === null) obs.startupMs = obs.totalMs;
      if (res.killedBy && launch.runscId) this.background(execOk(this.bins.runsc!, ['--root', p.host.runscState, 'delete', '--force', launch.runscId]));
      return raw;
    } finally {
      if (egress) await egress.close();
      // After the result is handed back: none of this is on the run's critical path.
      const cg = cgroup;
      this.background(new Promise((r) => setImmediate(r)).then(() => cleanupRun(dir, cg)));
      setImmediate(() => this.refillWarm());
    }
  }

  private interpreter(version: string): string | null {
    return this.config.python_interpreters[version] ?? null;
  }

  private makeHost(engine: EngineName): SandboxHost {
    const extraRo = new Set<string>();
    for (const interp of Object.values(this.config.python_interpreters)) {
      // Interpreters outside /usr need their prefix (bin/.. ) visible too.
      if (!interp.startsWith('/usr/')) extraRo.add(path.dirname(path.dirname(interp)));
    }
    for (const fl of this.config.pip.find_links) if (fl.startsWith('/') && existsSync(fl)) extraRo.add(path.resolve(fl));
    return new SandboxHost(
      {
        engine,
        bins: this.bins,
        root: path.join(this.root, engine),
        runnerSource: RUNNER_SOURCE,
        seccomp: this.config.enable_seccomp,
        gvisorPlatform: this.config.gvisor_platform,
        extraRo: [...extraRo],
      },
      this.config.enable_seccomp && engine === 'bubblewrap' ? compileSeccompBpf() : null,
    );
  }

  private async prepareRunsDir(runsDir: string, cgroups: CgroupSupport | null): Promise<boolean> {
    const mounted = isMountPoint(runsDir);
    if (existsSync(runsDir)) {
      // Run directories of an earlier process are orphans.
      for (const e of readdirSync(runsDir)) rmSync(path.join(runsDir, e), { recursive: true, force: true });
    }
    mkdirSync(runsDir, { recursive: true, mode: 0o755 });
    if (mounted) return true;
    // As root (with cgroups to charge it to), run outputs live in memory: a run that writes a lot hits
    // its own memory limit instead of filling the host's disk.
    if (cgroups && (await execOk('mount', ['-t', 'tmpfs', '-o', 'mode=755,nosuid,nodev', 'sandpod-runs', runsDir]))) return true;
    return false;
  }

  private async removeRunscOrphans(host: SandboxHost): Promise<void> {
    const ids = await execOut(this.bins.runsc!, ['--root', host.runscState, 'list', '-quiet']);
    const list = ids.split('\n').map((s) => s.trim()).filter(Boolean);
    if (list.length === 0) return;
    await execOk(this.bins.runsc!, ['--root', host.runscState, 'delete', '--force', ...list]);
    this.log.info({ count: list.length }, 'removed orphaned runsc containers');
  }

  /** pip install into `target` inside a sandbox of the same engine (network allowed, uid 1000). */
  private async install(p: Prepared, interpreter: string, target: string, reqs: string[], deadline: number, signal?: AbortSignal): Promise<InstallOutcome> {
    const id = `sp-deps-${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`;
    const dir = path.join(p.runsDir, id);
    mkdirSync(dir, { mode: 0o755 });
    if (p.engine === 'process') {
      mkdirSync(path.join(dir, 'tmp'), { mode: 0o700 });
      SandboxHost.ownBySandbox(path.join(dir, 'tmp'));
    }
    const memoryBytes = 2 * 1024 ** 3;
    const cgroup = p.cgroups?.create(id, { memoryBytes, pids: 4096, cpus: 2 }) ?? null;
    try {
      const mounts: Mount[] = [
        { type: 'rw', src: target, dest: '/deps-build' },
        { type: 'rw', src: p.deps.pipCacheDir, dest: '/pip-cache' },
        p.engine === 'process' ? { type: 'rw', src: path.join(dir, 'tmp'), dest: '/tmp' } : { type: 'tmpfs', dest: '/tmp', sizeBytes: memoryBytes },
      ];
      const at = (d: string) => p.host.insidePath({ mounts }, d);
      const pip = this.config.pip;
      const argv = [
        interpreter, '-m', 'pip', 'install',
        '--target', at('/deps-build'),
        '--cache-dir', at('/pip-cache'),
        '--disable-pip-version-check', '--no-input', '--no-warn-script-location', '--progress-bar', 'off',
        ...(pip.index_url ? ['--index-url', pip.index_url] : []),
        ...pip.find_links.flatMap((f) => ['--find-links', f]),
        ...(pip.no_index ? ['--no-index'] : []),
        ...pip.extra_args,
        ...reqs,
      ];
      const env = { ...programEnv([], {}, at('/tmp')), PIP_NO_COLOR: '1', PYTHONDONTWRITEBYTECODE: '1' };
      const launch = p.host.launch({
        id,
        dir,
        argv,
        env,
        cwd: '/tmp',
        mounts,
        network: true,
        rlimits: { nofile: 4096 },
        procsFiles: cgroup?.procsFiles ?? [],
      });
      const res = await this.execute(launch, { startupDeadline: deadline, timeoutMs: 0, signal, collectStdout: true, kill: () => cgroup?.killAll() });
      if (res.killedBy && launch.runscId) this.background(execOk(this.bins.runsc!, ['--root', p.host.runscState, 'delete', '--force', launch.runscId]));
      const output = (res.stdoutTail + res.stderrTail).trim();
      return {
        ok: !res.killedBy && !res.spawnError && res.exitCode === 0,
        output: res.spawnError ? `cannot start the install sandbox: ${res.spawnError}` : output.slice(-PIP_TAIL),
        timedOut: res.killedBy === 'deadline',
        cancelled: res.killedBy === 'abort',
      };
    } finally {
      this.background(cleanupRun(dir, cgroup));
    }
  }

  /**
   * Keeps `warmTarget` pre-started processes waiting in fresh cgroups: moving a process between
   * cgroups costs a kernel RCU grace period (~10 ms here), which this takes off a run's critical path.
   */
  private refillWarm(): void {
    const p = this.p;
    if (!p || !p.cgroups || !p.spawner || this.stopping) return;
    while (this.warm.length < this.warmTarget) {
      const id = `sp-w-${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`;
      let cgroup: RunCgroup;
      try {
        cgroup = p.cgroups.create(id, { memoryBytes: 256 * 1024 * 1024, pids: 16, cpus: 1 });
      } catch (err) {
        this.log.warn({ err }, 'cannot create a cgroup for a warm sandbox shell');
        return;
      }
      const proc = p.spawner.warm({ procsFiles: cgroup.procsFiles, fdFiles: p.host.fdFiles(), drop: p.host.privilegeDrop() });
      if (!proc) {
        this.background(cgroup.remove());
        return;
      }
      const w: Warm = { proc, cgroup };
      this.warm.push(w);
      void proc.closed.then(() => {
        const i = this.warm.indexOf(w);
        if (i >= 0) {
          this.warm.splice(i, 1);
          this.background(cgroup.remove());
        }
      });
    }
  }

  private takeWarm(): Warm | null {
    const w = this.warm.shift() ?? null;
    return w;
  }

  /**
   * Starts a launch — in a warm process when one is given (it execs the command), else
   * as a new process — and waits for it. The deadline is `startupDeadline` until the command writes
   * `execution` on its stdout, then that moment + `timeoutMs` + grace. On the deadline or an abort the
   * whole process group and the cgroup are killed.
   */
  private async execute(
    launch: Launch,
    o: {
      startupDeadline: number;
      timeoutMs: number;
      signal?: AbortSignal | undefined;
      onExecution?: () => void;
      collectStdout?: boolean;
      kill: () => void;
      warm?: SpawnedProc | undefined;
      /** The program writes to the sandbox's stdout/stderr (`--exec`): keep them, capped as given. */
      capture?: [number, number] | undefined;
    },
  ): Promise<ExecResult> {
    const res: ExecResult = { exitCode: null, signal: null, tExec: null, killedBy: null, stdoutTail: '', stderrTail: '', spawnError: null, captured: null };
    const outChunks: Buffer[] = [];
    const errChunks: Buffer[] = [];
    let proc: RunProc;
    if (o.warm) {
      proc = o.warm;
      o.warm.launch({ file: launch.file, args: launch.args, env: launch.env, cwd: launch.cwd, caps: o.capture });
    } else {
      try {
        proc = childProc(spawnProc(launch.file, launch.args, launch.env, launch.fdFiles, launch.cwd, false));
      } catch (err) {
        res.spawnError = (err as Error).message;
        return res;
      }
    }
    let settled = false;
    const killAll = (why: 'deadline' | 'abort') => {
      if (res.killedBy || settled) return;
      res.killedBy = why;
      proc.kill();
      o.kill();
    };
    let timer: NodeJS.Timeout | null = null;
    const arm = (at: number) => {
      if (timer) clearTimeout(timer);
      timer = setTimeout(() => killAll('deadline'), Math.max(0, at - Date.now()));
    };
    arm(o.startupDeadline);
    const onAbort = () => killAll('abort');
    o.signal?.addEventListener('abort', onAbort, { once: true });
    let stdoutBuf = '';
    proc.onStdout((chunk: Buffer) => {
      if (o.capture) outChunks.push(chunk);
      if (o.collectStdout) {
        res.stdoutTail = (res.stdoutTail + chunk.toString('utf8')).slice(-STDERR_TAIL);
      } else if (res.tExec === null) {
        stdoutBuf += chunk.toString('latin1');
        if (stdoutBuf.includes('execution\n')) {
          res.tExec = Date.now();
          // Nothing inside keeps the time limit of an in-process program: this deadline is it.
          arm(res.tExec + o.timeoutMs + (o.capture ? 0 : EXECUTION_GRACE_MS));
          o.onExecution?.();
        } else if (stdoutBuf.length > 64) {
          stdoutBuf = stdoutBuf.slice(-64);
        }
      }
    });
    proc.onStderr((chunk: Buffer) => {
      if (o.capture) errChunks.push(chunk);
      res.stderrTail = (res.stderrTail + chunk.toString('utf8')).slice(-STDERR_TAIL);
    });
    const [code, sig, spawnError] = await proc.closed;
    if (o.capture) res.captured = { stdout: Buffer.concat(outChunks), stderr: Buffer.concat(errChunks) };
    settled = true;
    if (timer) clearTimeout(timer);
    o.signal?.removeEventListener('abort', onAbort);
    res.spawnError = spawnError;
    res.exitCode = code ?? (sig ? 128 + signalNumber(sig) : null);
    res.signal = sig;
    return res;
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

export interface Proc {
  child: ChildProcess;
  /** Resolves once the process exited and its stdio closed: [code, signal, spawn error]. */
  closed: Promise<[number | null, NodeJS.Signals | null, string | null]>;
}

interface Warm {
  proc: SpawnedProc;
  cgroup: RunCgroup;
}

/**
 * Spawns in its own process group (so the whole group can be killed) with fd files as fds 3…, and
 * /dev/null over every fd the service inherited (which would otherwise reach the sandbox).
 */
export function spawnProc(file: string, args: string[], env: Record<string, string>, fdFiles: string[], cwd: string | undefined, stdinPipe: boolean): Proc {
  const fds = fdFiles.map((f) => openSync(f, 'r'));
  const leaked = inheritedFds();
  const devNull = leaked.length > 0 ? openSync('/dev/null', 'r') : -1;
  try {
    const stdio = coverInheritedFds<'pipe'>([stdinPipe ? 'pipe' : 'ignore', 'pipe', 'pipe', ...fds], devNull, leaked);
    const child = spawn(file, args, { env, stdio, detached: true, ...(cwd ? { cwd } : {}) });
    let spawnError: string | null = null;
    child.on('error', (err) => {
      spawnError = err.message;
    });
    const closed = new Promise<[number | null, NodeJS.Signals | null, string | null]>((resolve) => {
      child.on('close', (code, sig) => resolve([code, sig, spawnError]));
    });
    return { child, closed };
  } finally {
    for (const fd of fds) closeSync(fd);
    if (devNull >= 0) closeSync(devNull);
  }
}

/** A spawned child as a {@link RunProc}. */
function childProc(p: Proc): RunProc {
  return {
    onStdout: (cb) => p.child.stdout!.on('data', cb),
    onStderr: (cb) => p.child.stderr!.on('data', cb),
    kill: () => {
      try {
        if (p.child.pid) process.kill(-p.child.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    },
    closed: p.closed,
  };
}

interface ExecResult {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  /** When the runner said user code starts (epoch ms). */
  tExec: number | null;
  killedBy: 'deadline' | 'abort' | null;
  stdoutTail: string;
  stderrTail: string;
  spawnError: string | null;
  /** The sandbox's stdout/stderr, up to the caps (`capture` only). */
  captured: { stdout: Buffer; stderr: Buffer } | null;
}

/** A captured stream as the runner would have kept it: the first `cap` bytes (the caps let one more through). */
function capped(b: Buffer, cap: number): { text: string; truncated: boolean } {
  return { text: new TextDecoder('utf-8').decode(b.subarray(0, cap)), truncated: b.length > cap };
}

/** The program's environment; mirrors `program_env` in runner.py so the runner needs no re-exec. */
export function programEnv(pythonPath: string[], jobEnv: Record<string, string>, tmp = '/tmp'): Record<string, string> {
  const env: Record<string, string> = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: tmp, TMPDIR: tmp, LANG: 'C.UTF-8' };
  if (pythonPath.length) env.PYTHONPATH = pythonPath.join(':');
  for (const [k, v] of Object.entries(jobEnv)) env[k] = v;
  return env;
}

async function cleanupRun(dir: string, cgroup: RunCgroup | null): Promise<void> {
  await cgroup?.remove();
  rmSync(dir, { recursive: true, force: true });
}

/** Runs `print(1)` once through the engine; null when it printed 1, else why not. */
async function probe(host: SandboxHost, runsDir: string, interpreter: string): Promise<string | null> {
  try {
    const r = await floorOnce(host, runsDir, interpreter, 'probe', 30_000);
    return r.ok ? null : r.error;
  } catch (err) {
    return (err as Error).message;
  }
}

/**
 * One bare run of `print(1)` through an engine: the same mounts and sandbox options as a real run,
 * but no runner, no cgroups, no dependency step and no output collection.
 */
async function floorOnce(host: SandboxHost, runsDir: string, interpreter: string, tag: string, timeoutMs: number): Promise<{ ok: boolean; ms: number; error: string }> {
  const id = `sp-${tag}-${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`;
  const dir = path.join(runsDir, id);
  mkdirSync(path.join(dir, 'code'), { recursive: true, mode: 0o755 });
  mkdirSync(path.join(dir, 'input'), { mode: 0o755 });
  mkdirSync(path.join(dir, 'output'), { mode: 0o755 });
  writeFileSync(path.join(dir, 'code', 'main.py'), 'print(1)\n', { mode: 0o644 });
  writeFileSync(path.join(dir, 'input', 'data.json'), '{}', { mode: 0o644 });
  SandboxHost.ownBySandbox(path.join(dir, 'output'));
  if (host.engine === 'process') {
    mkdirSync(path.join(dir, 'tmp'), { mode: 0o700 });
    SandboxHost.ownBySandbox(path.join(dir, 'tmp'));
  }
  try {
    const t0 = performance.now();
    const mounts: Mount[] = [
      { type: 'ro', src: path.join(dir, 'code'), dest: '/code' },
      { type: 'ro', src: path.join(dir, 'input'), dest: '/input' },
      { type: 'rw', src: path.join(dir, 'output'), dest: '/output' },
      host.engine === 'process' ? { type: 'rw', src: path.join(dir, 'tmp'), dest: '/tmp' } : { type: 'tmpfs', dest: '/tmp', sizeBytes: 512 * 1024 * 1024 },
    ];
    const at = (d: string) => host.insidePath({ mounts }, d);
    const launch = host.launch({
      id,
      dir,
      argv: [interpreter, at('/code/main.py')],
      env: programEnv([], {}, at('/tmp')),
      cwd: '/tmp',
      mounts,
      network: false,
      rlimits: { nofile: SANDBOX_NOFILE },
      procsFiles: [],
    });
    const proc = spawnProc(launch.file, launch.args, launch.env, launch.fdFiles, launch.cwd, false);
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => {
      try {
        if (proc.child.pid) process.kill(-proc.child.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }, timeoutMs);
    proc.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString()));
    proc.child.stderr!.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4000)));
    const [code, , spawnError] = await proc.closed;
    clearTimeout(timer);
    if (spawnError) stderr += spawnError;
    const ms = performance.now() - t0;
    const ok = code === 0 && stdout === '1\n';
    return { ok, ms, error: ok ? '' : `exit ${code}, stdout ${JSON.stringify(stdout.slice(0, 200))}, stderr ${stderr.trim().slice(-1000)}` };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const OWNER_FILE = 'owner.pid';

/**
 * Marks the workspace as this process's (`owner.pid`, created exclusively). A live other process
 * holding it is an error; a dead one's claim is taken over. Several runtimes of one process (tests)
 * may share it.
 */
export function claimWorkspace(root: string, workspace: string): void {
  mkdirSync(root, { recursive: true, mode: 0o755 });
  const file = path.join(root, OWNER_FILE);
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      writeFileSync(file, String(process.pid), { flag: 'wx' });
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const pid = Number(readFileSync(file, 'utf8').trim());
    if (pid === process.pid) return;
    if (Number.isInteger(pid) && pid > 0 && pidAlive(pid)) {
      throw new Error(`workspace ${workspace} is in use by another sandpod process (pid ${pid}); give each process its own SVC_WORKSPACE`);
    }
    rmSync(file, { force: true });
  }
  throw new Error(`could not claim workspace ${workspace}`);
}

/** Gives the workspace up if this process holds it. */
export function releaseWorkspace(root: string): void {
  const file = path.join(root, OWNER_FILE);
  try {
    if (Number(readFileSync(file, 'utf8').trim()) === process.pid) rmSync(file, { force: true });
  } catch {
    /* not claimed */
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Options of {@link measureBareFloor}. */
export interface BareFloorOptions {
  /** Engine to measure (default: what `sandbox_engine`/`security_mode` would pick). */
  engine?: EngineName;
  iterations?: number;
  /** Interpreter (default: the configured one for 3.11, else the first configured). */
  interpreter?: string;
}

/**
 * The bare floor for `make bench`: runs `print(1)` through the engine directly — same sandbox
 * options and mounts as a real run, no service, no runner, no cgroups — `iterations` times in a row
 * and returns each wall time in milliseconds. Throws when the engine does not print `1`.
 * Uses its own directory under the workspace, so it can run next to a started runtime.
 */
export async function measureBareFloor(config: Config, options: BareFloorOptions = {}): Promise<number[]> {
  const bins = findEngineBinaries(config);
  const engine = options.engine ?? (await detectEngines(config)).chosen;
  if (!engine) throw new Error('no usable sandbox engine');
  const interpreter = options.interpreter ?? config.python_interpreters['3.11'] ?? firstInterpreter(config);
  const { root } = instanceRoot(config);
  const floorRoot = path.join(root, 'floor');
  const host = new SandboxHost(
    { engine, bins, root: path.join(floorRoot, engine), runnerSource: RUNNER_SOURCE, seccomp: config.enable_seccomp, gvisorPlatform: config.gvisor_platform, extraRo: [] },
    config.enable_seccomp && engine === 'bubblewrap' ? compileSeccompBpf() : null,
  );
  const runsDir = path.join(floorRoot, 'runs');
  mkdirSync(runsDir, { recursive: true, mode: 0o755 });
  const times: number[] = [];
  for (let i = 0; i < (options.iterations ?? 1); i++) {
    const r = await floorOnce(host, runsDir, interpreter, 'floor', 60_000);
    if (!r.ok) throw new Error(`bare ${engine} run failed: ${r.error}`);
    times.push(r.ms);
  }
  return times;
}

/** Engines on this machine: installed and proven to run `print(1)`; `chosen` is what start() would pick. */
export interface EngineDetection {
  engines: Record<EngineName, { installed: boolean; works: boolean; error?: string }>;
  chosen: EngineName | null;
}

/** Detects which engines work (runs one tiny sandbox per installed engine). */
export async function detectEngines(config: Config): Promise<EngineDetection> {
  const bins = findEngineBinaries(config);
  const { root } = instanceRoot(config);
  const probeRoot = path.join(root, 'detect');
  const runsDir = path.join(probeRoot, 'runs');
  mkdirSync(runsDir, { recursive: true, mode: 0o755 });
  const interpreter = config.python_interpreters['3.11'] ?? firstInterpreter(config);
  const engines = {} as EngineDetection['engines'];
  for (const engine of ['gvisor', 'bubblewrap', 'process'] as const) {
    const installed = engineInstalled(engine, bins);
    if (!installed) {
      engines[engine] = { installed, works: false, error: 'not installed' };
      continue;
    }
    const host = new SandboxHost(
      { engine, bins, root: path.join(probeRoot, engine), runnerSource: RUNNER_SOURCE, seccomp: config.enable_seccomp, gvisorPlatform: config.gvisor_platform, extraRo: [] },
      config.enable_seccomp && engine === 'bubblewrap' ? compileSeccompBpf() : null,
    );
    const err = await probe(host, runsDir, interpreter);
    engines[engine] = err === null ? { installed, works: true } : { installed, works: false, error: err };
  }
  const chosen = candidateEngines(config).find((e) => engines[e].works) ?? null;
  return { engines, chosen };
}

function firstInterpreter(config: Config): string {
  const first = Object.values(config.python_interpreters)[0];
  if (!first) throw new Error('python_interpreters is empty');
  return first;
}

function checkTraversable(dir: string, workspace: string): void {
  // bwrap runs as uid 1000 and must reach the run directories: every ancestor needs o+x. Inside the
  // workspace we add the x bit ourselves (search, not listing); above it we only say what is wrong.
  const ws = path.resolve(workspace);
  let d = path.resolve(dir);
  const parts: string[] = [];
  while (true) {
    parts.push(d);
    const up = path.dirname(d);
    if (up === d) break;
    d = up;
  }
  for (const p of parts.reverse()) {
    if (!existsSync(p)) mkdirSync(p, { mode: 0o755 });
    const mode = statSync(p).mode;
    if (process.getuid?.() !== 0 || (mode & 0o001) !== 0) continue;
    if (p === ws || p.startsWith(ws + path.sep)) chmodSync(p, (mode & 0o7777) | 0o001);
    else throw new Error(`path ${p} above the workspace is not traversable by the sandbox user (uid 1000); chmod o+x it or choose another workspace`);
  }
}

function isMountPoint(dir: string): boolean {
  try {
    return readFileSync('/proc/self/mounts', 'utf8').split('\n').some((l) => l.split(' ')[1] === dir);
  } catch {
    return false;
  }
}

function execOk(file: string, args: string[]): Promise<boolean> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 30_000 }, (err) => resolve(!err));
  });
}

function execOut(file: string, args: string[]): Promise<string> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 30_000 }, (err, stdout) => resolve(err ? '' : String(stdout)));
  });
}

const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGILL: 4, SIGTRAP: 5, SIGABRT: 6, SIGBUS: 7, SIGFPE: 8, SIGKILL: 9, SIGUSR1: 10, SIGSEGV: 11, SIGUSR2: 12, SIGPIPE: 13, SIGALRM: 14, SIGTERM: 15, SIGXCPU: 24, SIGXFSZ: 25, SIGSYS: 31 };
function signalNumber(sig: string): number {
  return SIGNALS[sig] ?? 0;
}
