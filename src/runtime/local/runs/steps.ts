/**
 * The steps of one local run, in order (see local-runtime.ts for the whole): the requirements'
 * environment, the egress proxy, the cgroups, the runner's start and supervision, what the runtime
 * itself saw, and the closing of the observation. Each takes the run's {@link RunState}.
 */
import path from 'node:path';
import type { Clock } from '../../../clock.ts';
import { parseMemory } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import { emptyRun, RUNNER_TIMEOUT_EXIT } from '../../run-output.ts';
import { runEnv, type RawRun, type RunObservation } from '../../runtime.ts';
import { builtEnvironmentStep } from '../builds/build.ts';
import { prepareRequirements as prepareDeps } from '../builds/deps.ts';
import { sandboxInstaller } from '../builds/install-sandbox.ts';
import type { CgroupLimits } from '../cgroups.ts';
import type { EngineName } from '../engines.ts';
import { EGRESS_DIR, WRAPPER_FAILED_EXIT } from '../sandbox.ts';
import { EgressProxy } from './egress-proxy.ts';
import { superviseLaunch, type LaunchResult } from './proc.ts';
import { runnerSandbox } from './runner-command.ts';
import type { RunContext, RunState } from './run-state.ts';

/** Longest Unix socket path Linux takes (sun_path is 108 bytes with its NUL). */
const MAX_UNIX_PATH = 107;

/** Startup step: the requirements' environment, mounted at `/deps`; or how the run ends. */
export async function prepareRequirements(ctx: RunContext, s: RunState): Promise<Partial<RunObservation> | undefined> {
  const { p, spec } = s;
  if (spec.requirements.length === 0) return undefined;
  s.options.onPhase?.('installing');
  const deadline = s.t0 + spec.startupTimeoutSec * 1000;
  // A built job type: its pinned environment, nothing installed (production_mode refuses installs).
  const built = await builtEnvironmentStep(ctx.builder, ctx.config, spec, ctx.clock, deadline, s.options.signal);
  const key = { interpreter: s.interpreter, pythonVersion: spec.jobType.pythonVersion, pip: ctx.config.pip };
  const r = built.handled ? built : await prepareDeps(p.deps, spec.requirements, key, sandboxInstaller(ctx.installContext(p), s.interpreter), deadline, s.options.signal);
  s.obs.depInstallMs = r.installMs;
  if (r.end) return r.end;
  s.depsDir = r.depsDir;
  if (r.depsDir) s.rd.mount({ type: 'ro', src: r.depsDir, dest: '/deps' });
  return undefined;
}

/**
 * Startup step: a bridge type that lists allowed_hosts gets no network of its own, only this run's
 * proxy, which lets those hosts through (see egress-proxy.ts). The process engine isolates nothing.
 */
export async function openEgress(ctx: RunContext, s: RunState): Promise<Partial<RunObservation> | undefined> {
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
      if (!d.allowed) ctx.log.info({ execution_id: executionId, host: d.host, port: d.port, reason: d.reason }, 'egress refused');
    },
  });
  s.rd.mount({ type: 'ro', src: netDir, dest: EGRESS_DIR });
  return undefined;
}

/** Takes a warm process (and its cgroup) or creates the run's cgroups, with the job type's limits. */
export function placeInCgroups(s: RunState, memoryBytes: number): void {
  const { p, spec } = s;
  s.warm = p.warm?.take() ?? null;
  const limits = runLimits(p.engine, spec.jobType, memoryBytes, inProcess(s));
  if (s.warm) {
    s.cgroup = s.warm.cgroup;
    s.cgroup.setLimits(limits);
  } else {
    s.cgroup = p.cgroups?.create(s.rd.id, limits) ?? null;
  }
}

/** A run's cgroup limits (cold, or a warm sandbox of the job type). */
export function runLimits(engine: EngineName, jt: JobType, memoryBytes: number, inProcess: boolean): CgroupLimits {
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
export function inProcess(s: RunState): boolean {
  return s.warm !== null && s.p.engine === 'bubblewrap' && s.egress === null;
}

/** Starts the runner in the sandbox (in the warm process when there is one) and supervises it. */
export async function execute(ctx: RunContext, s: RunState, memoryBytes: number) {
  const { p, spec, rd } = s;
  const jt = spec.jobType;
  const inProc = inProcess(s);
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
    inProcess: inProc,
    sh: p.host.waitingShell(),
    procsFiles: s.cgroup?.procsFiles ?? [],
    runEnv: runEnv(spec),
  });
  const launch = p.host.launch(sandbox, s.warm !== null);
  const res = await superviseLaunch(launch, {
    clock: ctx.clock,
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
    capture: inProc ? [spec.maxStdoutBytes + 64, spec.maxStdoutBytes + 1] : undefined,
    framed: !inProc,
    onOutput: s.options.onOutput,
  });
  return { res, launch };
}

/**
 * What the runtime itself saw: cgroup counters, exit, who killed it, phase times, infra errors.
 * Then whatever is left in the cgroup is killed, or (`stop`, a warm sandbox destroyed later) stopped.
 */
export function observe(clock: Clock, s: RunState, res: LaunchResult, leftovers: 'kill' | 'stop' = 'kill'): void {
  const { obs, p, spec } = s;
  const tEnd = clock.now();
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
export function finish(clock: Clock, obs: RunObservation, t0: number, outcome: Partial<RunObservation>, produced: Omit<RawRun, 'observation'> | null = null): RawRun {
  Object.assign(obs, outcome);
  const t = clock.now();
  obs.endedAt = new Date(t);
  obs.totalMs = t - t0;
  if (obs.phase === 'startup') obs.startupMs = obs.totalMs;
  return produced ? { observation: obs, ...produced } : emptyRun(obs);
}
