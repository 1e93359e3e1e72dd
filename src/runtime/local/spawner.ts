/**
 * The Node side of `spawner.py`: one small long-lived root process that forks the sandboxes' first
 * processes, so the service's own (large) process never forks per run. See spawner.py for why and
 * for the line protocol.
 *
 * A {@link SpawnedProc} is a pre-forked child that already sits in its run's cgroups; `launch()`
 * makes it exec the sandbox command. Its stdout/stderr arrive as events, and `closed` resolves like
 * Node's 'close' (exited and both pipes at EOF).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, constants as fsConstants, openSync, writeSync } from 'node:fs';
import { Socket } from 'node:net';
import { constants } from 'node:os';
import { fileURLToPath } from 'node:url';
import { materializeParts, type PythonParts } from '../../util/python-parts.ts';

/**
 * The spawner's parts (`spawner/NN-name.py`: its set-up of a child, the warm child and the relay,
 * main), joined into one file because it runs as `python3 -I -S`, which imports nothing from beside
 * it (src/util/python-parts.ts); the build writes `dist/runtime/local/spawner.py`.
 */
export const SPAWNER_PARTS: PythonParts = {
  partsDir: fileURLToPath(new URL('./spawner/', import.meta.url)),
  built: fileURLToPath(new URL('./spawner.py', import.meta.url)),
  name: 'spawner',
};

/** Absolute path of the joined spawner script. */
export const SPAWNER_SOURCE = materializeParts(SPAWNER_PARTS);

/** [exit code, signal, why it could not be started]. */
export type ExitInfo = [number | null, NodeJS.Signals | null, string | null];

/** A process started for a run, however it was started. */
export interface RunProc {
  onStdout(cb: (chunk: Buffer) => void): void;
  onStderr(cb: (chunk: Buffer) => void): void;
  /** SIGKILL to the process group (no-op once it was reaped). */
  kill(): void;
  /** Resolves once the process exited and its stdio closed. */
  closed: Promise<ExitInfo>;
}

/** What a warm child execs. */
export interface SpawnCommand {
  file: string;
  args: string[];
  env: Record<string, string>;
  cwd?: string | undefined;
  /**
   * At most this many bytes of stdout and of stderr are passed on, by a relay that stays in the
   * run's cgroups (so dropping the rest is charged to the run); it ends as the command ended.
   */
  caps?: [number, number] | undefined;
}

/** How a warm child is prepared before it waits for its command. */
export interface WarmOptions {
  /** cgroup.procs files it enters. */
  procsFiles: string[];
  /** Files opened read-only (as root) that become the command's fds 3, 4, … */
  fdFiles: string[];
  /** Drop root to these ids the way `setpriv` does (no groups, no capabilities, no_new_privs). */
  drop: { uid: number; gid: number } | null;
  /** stdin is a pipe that takes one message ({@link SpawnedProc.input}) instead of /dev/null. */
  stdin?: boolean;
  /**
   * Like `stdin`, but stdin and stdout are named pipes made at these paths (in a directory only
   * root can reach) whose other ends this process holds: the one message and the command's stdout
   * pass no process in between (a warm sandbox's go line and its runner's answers, on the critical
   * path of a run). Implies `stdin`.
   */
  fifos?: { in: string; out: string };
}

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]));
/** Don't restart a spawner that died more often than this. */
const RESTART_INTERVAL_MS = 5000;

interface Event {
  ev: 'pid' | 'out' | 'err' | 'exit';
  id: string;
  pid?: number;
  d?: string;
  code?: number | null;
  sig?: number | null;
  error?: string;
}

/** A pre-forked child of the spawner. */
export class SpawnedProc implements RunProc {
  pid: number | null = null;
  readonly closed: Promise<ExitInfo>;
  private resolveClosed!: (v: ExitInfo) => void;
  private out: ((b: Buffer) => void) | Buffer[] = [];
  private err: ((b: Buffer) => void) | Buffer[] = [];
  private done = false;
  /** `fifos`: the write end of the command's stdin (until input() or the end). */
  private inFd: number | null = null;
  /** `fifos`: the read end of the command's stdout. */
  private outPipe: Socket | null = null;
  /** `fifos`: the launch waits until both ends are open (see spawner.py). */
  private pendingLaunch: object | null = null;
  /** `fifos`: the exit the spawner reported, held until stdout reached EOF too. */
  private exit: ExitInfo | null = null;
  private openError: string | null = null;
  /** `fifos`: what {@link write} was given before the pipes were open. */
  private pendingWrite = '';
  private opened = false;

  constructor(
    readonly id: string,
    private readonly owner: Spawner,
    private readonly gen: number,
    private readonly fifos: { in: string; out: string } | null = null,
  ) {
    this.closed = new Promise((r) => (this.resolveClosed = r));
  }

  /** Makes the child exec `cmd`. */
  launch(cmd: SpawnCommand): void {
    const msg = { op: 'launch', id: this.id, file: cmd.file, args: cmd.args, env: cmd.env, cwd: cmd.cwd ?? null, caps: cmd.caps ?? null };
    if (this.fifos && this.pid === null) this.pendingLaunch = msg;
    else if (!this.openError) this.owner.send(this.gen, msg);
  }

  /** Writes `text` to the stdin pipe (a child warmed with `stdin` or `fifos`) and closes it; once. */
  input(text: string): void {
    if (this.done) return;
    if (!this.fifos) {
      this.owner.send(this.gen, { op: 'input', id: this.id, d: text });
      return;
    }
    const fd = this.inFd;
    this.inFd = null;
    if (fd === null) return;
    try {
      // Non-blocking, into an empty pipe: a line far below its 64 KiB capacity goes in whole.
      writeSync(fd, text);
    } catch {
      /* the command is gone (EPIPE): its end is reported by `closed` */
    } finally {
      closeSync(fd);
    }
  }

  /**
   * Writes `text` to the stdin pipe of a child warmed with `fifos` and keeps it open (a session's
   * channel: one short line per cell). Lines are far below the pipe's capacity and the reader drains
   * it between cells, so the non-blocking write goes in whole.
   */
  write(text: string): void {
    if (this.done) return;
    // Before the pipes are open (no "pid" event yet): written as soon as they are.
    if (this.fifos && !this.opened && !this.openError) {
      this.pendingWrite += text;
      return;
    }
    if (this.inFd === null) return;
    try {
      writeSync(this.inFd, text);
    } catch {
      /* the command is gone (EPIPE): its end is reported by `closed` */
    }
  }

  /** @internal The child and its named pipes exist: open this process's ends, then launch. */
  started(pid: number | null): void {
    this.pid = pid;
    this.opened = true;
    if (!this.fifos) return;
    try {
      // The child holds IN's read end and the spawner a reader of OUT until the launch: neither open blocks.
      this.inFd = openSync(this.fifos.in, fsConstants.O_WRONLY | fsConstants.O_NONBLOCK);
      const pipe = new Socket({ fd: openSync(this.fifos.out, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK), readable: true, writable: false });
      this.outPipe = pipe;
      pipe.on('data', (b: Buffer) => this.deliver('out', b));
      pipe.on('error', () => pipe.destroy());
      pipe.on('close', () => {
        this.outPipe = null;
        if (this.exit) this.finish(this.exit);
      });
    } catch (err) {
      this.openError = `cannot open the sandbox's pipes: ${(err as Error).message}`;
      this.closeEnds();
      this.owner.send(this.gen, { op: 'kill', id: this.id });
      return;
    }
    const launch = this.pendingLaunch;
    this.pendingLaunch = null;
    if (launch) this.owner.send(this.gen, launch);
    const text = this.pendingWrite;
    this.pendingWrite = '';
    if (text) this.write(text);
  }

  kill(): void {
    if (!this.done) this.owner.send(this.gen, { op: 'kill', id: this.id });
  }

  onStdout(cb: (chunk: Buffer) => void): void {
    const pending = this.out;
    this.out = cb;
    if (Array.isArray(pending)) for (const b of pending) cb(b);
  }

  onStderr(cb: (chunk: Buffer) => void): void {
    const pending = this.err;
    this.err = cb;
    if (Array.isArray(pending)) for (const b of pending) cb(b);
  }

  /** @internal */
  deliver(which: 'out' | 'err', b: Buffer): void {
    const sink = which === 'out' ? this.out : this.err;
    if (Array.isArray(sink)) sink.push(b);
    else sink(b);
  }

  /**
   * @internal The child ended (`force`: its spawner is gone, nothing more will come). Resolves
   * `closed` once stdout reached EOF too, as Node's 'close' would.
   */
  finish(v: ExitInfo, force = false): void {
    if (this.done) return;
    this.exit = this.openError ? [v[0], v[1], this.openError] : v;
    if (this.inFd !== null) {
      closeSync(this.inFd);
      this.inFd = null;
    }
    if (force) this.closeEnds();
    if (this.outPipe) return;
    this.done = true;
    this.resolveClosed(this.exit);
  }

  private closeEnds(): void {
    if (this.inFd !== null) closeSync(this.inFd);
    this.inFd = null;
    const pipe = this.outPipe;
    this.outPipe = null;
    pipe?.destroy();
  }
}

/** The spawner process; started on first use, restarted (rate-limited) when it dies. */
export class Spawner {
  private proc: ChildProcess | null = null;
  private gen = 0;
  private seq = 0;
  private lastStart = 0;
  private stopped = false;
  private readonly live = new Map<string, SpawnedProc>();
  private exited: Promise<void> = Promise.resolve();

  constructor(
    private readonly python: string,
    private readonly onProblem: (msg: string) => void,
  ) {}

  /** A new warm child; null when the spawner cannot run right now. */
  warm(o: WarmOptions): SpawnedProc | null {
    if (!this.ensure()) return null;
    const p = new SpawnedProc(String(++this.seq), this, this.gen, o.fifos ?? null);
    this.live.set(p.id, p);
    const stdin = o.fifos ? { fifos: [o.fifos.in, o.fifos.out] } : o.stdin ? { stdin: true } : {};
    this.send(this.gen, { op: 'warm', id: p.id, procs: o.procsFiles, fds: o.fdFiles, drop: o.drop, ...stdin });
    return p;
  }

  /** @internal Writes a command to the spawner of generation `gen` (dropped when that one is gone). */
  send(gen: number, msg: object): void {
    if (!this.proc || gen !== this.gen) return;
    this.proc.stdin!.write(`${JSON.stringify(msg)}\n`);
  }

  /**
   * Stops the spawner once nothing it started is alive any more (running sandboxes are not killed
   * here; their owner cancels them). Resolves when it exited, or at once when there is nothing left.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    this.endIfIdle();
    if (this.live.size === 0) await this.exited;
  }

  private endIfIdle(): void {
    if (this.stopped && this.live.size === 0 && this.proc) this.proc.stdin!.end();
  }

  private ensure(): boolean {
    if (this.proc) return true;
    if (this.stopped) return false;
    const now = Date.now();
    if (this.lastStart && now - this.lastStart < RESTART_INTERVAL_MS) return false;
    this.lastStart = now;
    const gen = ++this.gen;
    let child: ChildProcess;
    try {
      child = spawn(this.python, ['-I', '-S', SPAWNER_SOURCE], { stdio: ['pipe', 'pipe', 'pipe'], env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } });
    } catch (err) {
      this.onProblem(`cannot start the sandbox spawner: ${(err as Error).message}`);
      return false;
    }
    this.proc = child;
    child.stdin!.on('error', () => {});
    let buf = '';
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (s: string) => {
      buf += s;
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line) this.onEvent(JSON.parse(line) as Event);
      }
    });
    let stderr = '';
    child.stderr!.on('data', (b: Buffer) => (stderr = (stderr + b.toString('utf8')).slice(-4000)));
    let spawnError: string | null = null;
    child.on('error', (err) => (spawnError = err.message));
    this.exited = new Promise((resolve) => {
      child.on('close', (code, sig) => {
        if (this.gen === gen) this.proc = null;
        const orphans = [...this.live.values()];
        this.live.clear();
        for (const p of orphans) p.finish([null, null, `the sandbox spawner exited (${spawnError ?? code ?? sig})`], true);
        if (!this.stopped || orphans.length > 0 || code !== 0) {
          this.onProblem(`sandbox spawner exited (${spawnError ?? code ?? sig}): ${stderr.trim().slice(-2000)}`);
        }
        resolve();
      });
    });
    return true;
  }

  private onEvent(ev: Event): void {
    const p = this.live.get(ev.id);
    if (!p) return;
    if (ev.ev === 'pid') {
      p.started(ev.pid ?? null);
    } else if (ev.ev === 'out' || ev.ev === 'err') {
      p.deliver(ev.ev, Buffer.from(ev.d ?? '', 'latin1'));
    } else if (ev.ev === 'exit') {
      this.live.delete(ev.id);
      p.finish([ev.code ?? null, ev.sig ? (SIGNAL_NAMES.get(ev.sig) ?? null) : null, ev.error ?? null]);
      this.endIfIdle();
    }
  }
}
