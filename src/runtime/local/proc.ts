/**
 * Starting sandbox processes and watching them to the end: {@link spawnProc} (a new process group
 * that inherits none of the service's fds), {@link superviseLaunch} (the run's deadline, the
 * runner's `execution` marker, cancellation, capped stream tails) and the small `execFile` helpers
 * the runtime uses for mount/runsc housekeeping.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { constants } from 'node:os';
import type { Clock } from '../../clock.ts';
import { coverInheritedFds, inheritedFds } from '../../util/inherited-fds.ts';
import type { Launch } from './sandbox.ts';
import type { RunProc, SpawnedProc } from './spawner.ts';

/** Extra time the runtime gives the runner's own timeout before its backstop kills the sandbox. */
export const EXECUTION_GRACE_MS = 1500;
/** Bytes kept of a process's stderr (and stdout, when collected) for error messages. */
const STREAM_TAIL = 8192;
/** The line the runner writes on its stdout when user code starts (see runner.py `--phase-fd`). */
export const EXECUTION_MARKER = 'execution\n';

/** A spawned child and its end. */
export interface Proc {
  child: ChildProcess;
  /** Resolves once the process exited and its stdio closed: [code, signal, spawn error]. */
  closed: Promise<[number | null, NodeJS.Signals | null, string | null]>;
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

/** SIGKILL to a spawned child's whole process group; nothing when it is gone. */
export function killGroup(p: Proc): void {
  try {
    if (p.child.pid) process.kill(-p.child.pid, 'SIGKILL');
  } catch {
    /* gone */
  }
}

/** A spawned child as a {@link RunProc}. */
function childProc(p: Proc): RunProc {
  return {
    onStdout: (cb) => p.child.stdout!.on('data', cb),
    onStderr: (cb) => p.child.stderr!.on('data', cb),
    kill: () => killGroup(p),
    closed: p.closed,
  };
}

/** The number of a signal by name (as the shell reports a signal death: 128 + n); 0 when unknown. */
export function signalNumber(sig: string): number {
  return (constants.signals as Record<string, number | undefined>)[sig] ?? 0;
}

/** What {@link superviseLaunch} saw. */
export interface LaunchResult {
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

/** Options of {@link superviseLaunch}. */
export interface SuperviseOptions {
  clock: Clock;
  /** Deadline (epoch ms) until the command writes `execution` on its stdout. */
  startupDeadline: number;
  /** Execution time limit after the marker (ms); the deadline adds {@link EXECUTION_GRACE_MS} unless `capture`. */
  timeoutMs: number;
  signal?: AbortSignal | undefined;
  onExecution?: () => void;
  /** Keep a tail of stdout instead of watching it for the marker (pip). */
  collectStdout?: boolean;
  /** Also kills what the process group does not hold (the run's cgroup). */
  kill: () => void;
  /** A warm process to exec the launch in, instead of spawning one. */
  warm?: SpawnedProc | undefined;
  /** The program writes to the sandbox's stdout/stderr (`--exec`): keep them, capped as given. */
  capture?: [number, number] | undefined;
}

/**
 * Starts a launch — in a warm process when one is given (it execs the command), else as a new
 * process — and waits for it. The deadline is `startupDeadline` until the command writes
 * `execution` on its stdout, then that moment + `timeoutMs` (+ grace). On the deadline or an abort
 * the whole process group and the cgroup are killed.
 */
export async function superviseLaunch(launch: Launch, o: SuperviseOptions): Promise<LaunchResult> {
  const res: LaunchResult = { exitCode: null, signal: null, tExec: null, killedBy: null, stdoutTail: '', stderrTail: '', spawnError: null, captured: null };
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
    timer = setTimeout(() => killAll('deadline'), Math.max(0, at - o.clock.now()));
  };
  arm(o.startupDeadline);
  const onAbort = () => killAll('abort');
  o.signal?.addEventListener('abort', onAbort, { once: true });
  let stdoutBuf = '';
  proc.onStdout((chunk: Buffer) => {
    if (o.capture) outChunks.push(chunk);
    if (o.collectStdout) {
      res.stdoutTail = (res.stdoutTail + chunk.toString('utf8')).slice(-STREAM_TAIL);
    } else if (res.tExec === null) {
      stdoutBuf += chunk.toString('latin1');
      if (stdoutBuf.includes(EXECUTION_MARKER)) {
        res.tExec = o.clock.now();
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
    res.stderrTail = (res.stderrTail + chunk.toString('utf8')).slice(-STREAM_TAIL);
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

/** Runs a command; resolves whether it exited 0 within 30 s. */
export function execOk(file: string, args: string[]): Promise<boolean> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 30_000 }, (err) => resolve(!err));
  });
}

/** Runs a command; resolves its stdout, or '' when it failed. */
export function execOut(file: string, args: string[]): Promise<string> {
  return new Promise((resolve) => {
    execFile(file, args, { timeout: 30_000 }, (err, stdout) => resolve(err ? '' : String(stdout)));
  });
}

/** Removes runsc containers by id (a killed run's container outlives its process). */
export function runscDelete(runsc: string, stateDir: string, ids: string[]): Promise<boolean> {
  return execOk(runsc, ['--root', stateDir, 'delete', '--force', ...ids]);
}

