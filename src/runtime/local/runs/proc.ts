/**
 * Starting sandbox processes and watching them to the end: {@link spawnProc} (a new process group
 * that inherits none of the service's fds), {@link superviseLaunch} (the run's deadline, the
 * runner's `execution` marker, cancellation, capped stream tails) and the small `execFile` helpers
 * the runtime uses for mount/runsc housekeeping.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { constants } from 'node:os';
import type { Clock } from '../../../clock.ts';
import { coverInheritedFds, inheritedFds } from '../../../util/inherited-fds.ts';
import { MAX_REPORT_BYTES } from '../../run-output.ts';
import type { Launch } from '../sandbox.ts';
import type { RunProc, SpawnedProc } from '../spawner.ts';

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
  /** The runner's `done N` line ended the run (`doneMarker`); the sandbox may still be tearing down. */
  byDoneMarker: boolean;
  /** The runner's report, when its done line carried it (`done N {report}`: a held warm sandbox wrote no report file). */
  doneReport: Buffer | null;
  /** The program's output as the runner framed it (`framed`), whole (the runner capped it). */
  framed: { stdout: Buffer; stderr: Buffer } | null;
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
  /** A process already running the launch (a claimed warm sandbox): nothing is started. */
  started?: RunProc | undefined;
  /**
   * The runner writes `done N` on stdout once its report is written (`--wait`): the result is taken
   * then, with exit status N, without waiting for the sandbox's teardown (the caller kills it).
   */
  doneMarker?: boolean;
  /**
   * The program's output as it is written, from the runner's `execution` marker on: the runner's
   * frames on stdout (`framed`, a forking runner with `--stream-frames`), or the sandbox's own
   * stdout/stderr (`capture`, an in-process program).
   */
  onOutput?: ((stream: 'stdout' | 'stderr', chunk: Buffer) => void) | undefined;
  /** The runner frames the program's output on stdout (`--stream-frames`): parsed out of the control lines. */
  framed?: boolean;
}

/** Longest control line of the runner's: `done N {report}`, a report being at most MAX_REPORT_BYTES. */
const MAX_CONTROL_LINE = MAX_REPORT_BYTES + 64;
const DONE_LINE = /(?:^|\n)done (\d{1,3})(?: ([^\n]+))?\n/;

/**
 * Starts a launch — in a warm process when one is given (it execs the command), else as a new
 * process — and waits for it. The deadline is `startupDeadline` until the command writes
 * `execution` on its stdout, then that moment + `timeoutMs` (+ grace). On the deadline or an abort
 * the whole process group and the cgroup are killed.
 */
export async function superviseLaunch(launch: Launch | null, o: SuperviseOptions): Promise<LaunchResult> {
  const res: LaunchResult = { exitCode: null, signal: null, tExec: null, killedBy: null, stdoutTail: '', stderrTail: '', spawnError: null, captured: null, byDoneMarker: false, doneReport: null, framed: null };
  const outChunks: Buffer[] = [];
  const errChunks: Buffer[] = [];
  let proc: RunProc;
  let doneCode: (code: number) => void = () => {};
  const done = new Promise<number>((r) => (doneCode = r));
  if (o.started) {
    proc = o.started;
  } else if (!launch) {
    res.spawnError = 'nothing to start';
    return res;
  } else if (o.warm) {
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
  const emit = (stream: 'stdout' | 'stderr', b: Buffer) => {
    if (b.length === 0 || !o.onOutput) return;
    try {
      o.onOutput(stream, b);
    } catch {
      /* live output is best effort */
    }
  };
  const framedOut: Buffer[] = [];
  const framedErr: Buffer[] = [];
  const frames = o.framed
    ? new FrameReader((stream, b) => {
        (stream === 'stdout' ? framedOut : framedErr).push(b);
        emit(stream, b);
      })
    : null;
  /** Control text after the marker (the `done N` line), scanned without the framed program output. */
  const control = (text: string) => {
    stdoutBuf += text;
    if (o.doneMarker) {
      const m = DONE_LINE.exec(stdoutBuf);
      if (m) {
        // Control lines arrive whole from the frame reader; latin1 gives the report's bytes back.
        if (m[2] !== undefined) res.doneReport = Buffer.from(m[2], 'latin1');
        doneCode(Number(m[1]));
      }
    }
    if (stdoutBuf.length > 64) stdoutBuf = stdoutBuf.slice(-64);
  };
  /** Stdout after the marker. */
  const afterMarker = (b: Buffer) => {
    if (frames) frames.feed(b, control);
    else {
      if (o.capture) emit('stdout', b);
      if (o.doneMarker) control(b.toString('latin1'));
    }
  };
  proc.onStdout((chunk: Buffer) => {
    if (o.capture) outChunks.push(chunk);
    if (o.collectStdout) {
      res.stdoutTail = (res.stdoutTail + chunk.toString('utf8')).slice(-STREAM_TAIL);
    } else if (res.tExec === null) {
      stdoutBuf += chunk.toString('latin1');
      const at = stdoutBuf.indexOf(EXECUTION_MARKER);
      if (at >= 0) {
        res.tExec = o.clock.now();
        // Nothing inside keeps the time limit of an in-process program: this deadline is it.
        arm(res.tExec + o.timeoutMs + (o.capture ? 0 : EXECUTION_GRACE_MS));
        o.onExecution?.();
        // Latin-1 maps bytes 1:1, so what follows the marker is the chunk's remaining bytes.
        const rest = Buffer.from(stdoutBuf.slice(at + EXECUTION_MARKER.length), 'latin1');
        stdoutBuf = '\n';
        afterMarker(rest);
      } else if (stdoutBuf.length > 64) stdoutBuf = stdoutBuf.slice(-64);
    } else if (o.doneMarker || frames || o.capture) {
      afterMarker(chunk);
    }
  });
  proc.onStderr((chunk: Buffer) => {
    if (o.capture) errChunks.push(chunk);
    if (o.capture && res.tExec !== null) emit('stderr', chunk);
    res.stderrTail = (res.stderrTail + chunk.toString('utf8')).slice(-STREAM_TAIL);
  });
  const end = await Promise.race([proc.closed, done]);
  const [code, sig, spawnError]: [number | null, NodeJS.Signals | null, string | null] = typeof end === 'number' ? [end, null, null] : end;
  res.byDoneMarker = typeof end === 'number';
  if (o.capture) res.captured = { stdout: Buffer.concat(outChunks), stderr: Buffer.concat(errChunks) };
  if (frames) res.framed = { stdout: Buffer.concat(framedOut), stderr: Buffer.concat(framedErr) };
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


/**
 * Parses the runner's `--stream-frames` output: a line `o LEN` / `e LEN` followed by LEN bytes of the
 * program's stdout / stderr (passed on as they arrive, a frame may span reads); any other line is the
 * runner's own (`done N`). Length-prefixed, so nothing the program prints can pass for a control line.
 */
export class FrameReader {
  private pending: Buffer = Buffer.alloc(0);
  private need = 0;
  private stream: 'stdout' | 'stderr' = 'stdout';

  constructor(private readonly emit: (stream: 'stdout' | 'stderr', b: Buffer) => void) {}

  feed(b: Buffer, control: (line: string) => void): void {
    let buf = this.pending.length > 0 ? Buffer.concat([this.pending, b]) : b;
    for (;;) {
      if (this.need > 0) {
        if (buf.length === 0) break;
        const take = Math.min(this.need, buf.length);
        this.emit(this.stream, buf.subarray(0, take));
        this.need -= take;
        buf = buf.subarray(take);
        continue;
      }
      const nl = buf.indexOf(10);
      if (nl < 0) break;
      const line = buf.subarray(0, nl).toString('latin1');
      buf = buf.subarray(nl + 1);
      const m = /^([oe]) (\d{1,9})$/.exec(line);
      if (m) {
        this.stream = m[1] === 'o' ? 'stdout' : 'stderr';
        this.need = Number(m[2]);
      } else {
        control(`${line}\n`);
      }
    }
    // A line split across reads waits for its end (a header is short, a done line with its report
    // at most MAX_CONTROL_LINE: anything longer is dropped).
    this.pending = buf.length > MAX_CONTROL_LINE ? Buffer.alloc(0) : Buffer.from(buf);
  }
}
