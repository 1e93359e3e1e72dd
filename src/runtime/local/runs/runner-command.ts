/**
 * The sandbox a run's `runner.py` is started in: its command line, its environment (the program
 * environment the runner would build, so it never has to re-exec to get a clean one), network and
 * rlimits, from the job type and the run directory.
 */
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { RunDir } from './run-dir.ts';
import { EGRESS_DIR, type SandboxSpec } from '../sandbox.ts';

/** Open files allowed to user code. */
export const SANDBOX_NOFILE = 1024;

/** The program's environment; mirrors `program_env` in runner.py so the runner needs no re-exec. */
export function programEnv(pythonPath: string[], jobEnv: Record<string, string>, tmp = '/tmp'): Record<string, string> {
  const env: Record<string, string> = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: tmp, TMPDIR: tmp, LANG: 'C.UTF-8' };
  if (pythonPath.length) env.PYTHONPATH = pythonPath.join(':');
  for (const [k, v] of Object.entries(jobEnv)) env[k] = v;
  return env;
}

/** What {@link runnerSandbox} needs to know about one run. */
export interface RunnerCommandOptions {
  rd: RunDir;
  interpreter: string;
  /** The runner as the sandbox sees it (`SandboxHost.runnerFor`). */
  runner: string;
  jobType: JobType;
  timeoutSec: number;
  maxStreamBytes: number;
  memoryBytes: number;
  fileSizeBytes: number;
  /** `/deps` is mounted (requirements installed). */
  deps: boolean;
  /** The run's egress proxy socket is mounted at {@link EGRESS_DIR}. */
  egress: boolean;
  /** Limits come from cgroups; without them the runner sets rlimits for processes and memory. */
  cgroups: boolean;
  /** The program runs in the runner's own process under a waiting `sh` (see local-runtime.ts). */
  inProcess: boolean;
  /**
   * A warm sandbox (`--wait`): the runner loads and waits for its go line on stdin; `timeoutSec` and
   * `maxStreamBytes` here are placeholders the go line replaces (see sandbox-pool.ts).
   */
  wait?: boolean;
  /** With `wait`: modules the waiting runner imports before its go line (the job type's `preload`). */
  preload?: string[];
  /** The waiting `sh` of an in-process run, as the sandbox sees it (`SandboxHost.waitingShell`: not dumpable). */
  sh: string;
  /** The run's cgroup.procs files (empty without cgroups, or when a warm process is in them already). */
  procsFiles: string[];
  /** Added to the job type's environment for this run (`runEnv` in runtime.ts). */
  runEnv?: Record<string, string>;
}

/** The sandbox of one run: `runner.py` with the run's limits, mounts and network. */
export function runnerSandbox(o: RunnerCommandOptions): SandboxSpec {
  const { rd, jobType: jt } = o;
  return {
    id: rd.id,
    dir: rd.dir,
    argv: runnerArgv(o),
    env: programEnv(o.deps ? [rd.at('/deps')] : [], { ...jt.env, ...o.runEnv }, rd.host.engine === 'process' ? rd.at('/tmp') : '/tmp'),
    cwd: '/tmp',
    mounts: rd.mounts,
    network: jt.network.mode === 'bridge' && !o.egress,
    ...(o.egress ? { hostSockets: true } : {}),
    rlimits: { fsize: o.fileSizeBytes, nofile: SANDBOX_NOFILE, nproc: jt.maxProcesses },
    procsFiles: o.procsFiles,
  };
}

/** The runner's argv for one run (paths as the sandbox sees them). */
function runnerArgv(o: RunnerCommandOptions): string[] {
  const { rd, jobType: jt } = o;
  const argv = [
    // sh stays the waiting parent (`; exit $?`); its own stderr goes nowhere (it would say "Killed"
    // when the program dies by a signal), the program (exec'd in a subshell) gets the real one.
    ...(o.inProcess ? [o.sh, '-c', 'exec 9>&2 2>/dev/null; (exec "$@" 2>&9 9>&-); exit $?', 'sh'] : []),
    o.interpreter,
    rd.at(o.runner),
    '--code', rd.at('/code/main.py'),
    '--input', rd.at('/input/data.json'),
    '--output', rd.at('/output'),
    '--timeout', String(o.timeoutSec),
    '--max-stream-bytes', String(o.maxStreamBytes),
    '--phase-fd', '1',
    // The program's output reaches the host as it is written (GET /jobs/{id}/events): in-process it
    // is the sandbox's own stdout/stderr; a forking runner sends it framed on the phase fd.
    ...(o.inProcess ? ['--exec'] : ['--stream-frames']),
    // A pool sandbox waits long before its go line: its program's process warms up meanwhile.
    ...(o.wait ? ['--wait', '--warm-up'] : []),
    ...(o.wait && o.preload?.length ? ['--preload', o.preload.join(',')] : []),
    // With cgroups this runtime measures memory and CPU itself: the runner may take the program's
    // exit status from its exit notice instead of waiting out its process's teardown.
    ...(o.cgroups && !o.inProcess ? ['--prompt-exit'] : []),
    '--rlimit', `fsize=${o.fileSizeBytes}`,
    '--rlimit', `nofile=${SANDBOX_NOFILE}`,
    '--rlimit', 'core=0',
    // Without cgroups: the process count can only be bounded per uid, memory by address space
    // (exceeding it raises MemoryError instead of a SIGKILL), CPU not at all.
    ...(o.cgroups ? [] : ['--rlimit', `nproc=${jt.maxProcesses}`, '--rlimit', `as=${o.memoryBytes}`]),
    ...(o.deps ? ['--python-path', rd.at('/deps')] : []),
    ...(o.egress ? ['--egress-proxy', `${EGRESS_DIR}/proxy.sock`] : []),
    ...Object.entries({ ...jt.env, ...o.runEnv }).map(([k, v]) => `--env=${k}=${v}`),
  ];
  if (rd.host.engine === 'process') argv.push('--cwd', rd.at('/tmp'), '--tmp', rd.at('/tmp'));
  return argv;
}
