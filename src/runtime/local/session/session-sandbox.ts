/**
 * A session's sandbox on the local runtime (issue 19): one sandbox, for one session only, never reused,
 * running `runner.py --session` (a persistent interpreter; see the runner's session part). It is built
 * like every other local sandbox: the run directory of `RunDir` (read-only /code and /input, /output,
 * a /tmp tmpfs), plus `/workspace` (read-write, the cells' working directory), its own cgroup with the
 * job type's limits, the engine started by the spawner exactly as a cold run's, and the job type's
 * network rules (`runnerSandbox`, the one builder of a runner's sandbox).
 *
 * A cell: its code goes to `code/cell-N.py` (seen read-only at /code), its input to `input/data.json`,
 * a line down the runner's stdin; the runner answers with output frames and the cell's result. What the
 * cell wrote to /output is collected and /output emptied for the next cell.
 */
import { readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseMemory } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { Logger } from '../../../logger.ts';
import { baseObservation } from '../../run-output.ts';
import type { RawRun, RunnerReport } from '../../runtime.ts';
import { cellAfterEnd, type CellSpec, type SessionEnd, type SessionSandbox } from '../../session.ts';
import type { CgroupLimits, CgroupSupport, RunCgroup } from '../cgroups.ts';
import { collectOutputs } from '../runs/collect.ts';
import { runscDelete } from '../runs/proc.ts';
import { RunDir, sandboxId } from '../runs/run-dir.ts';
import { runnerSandbox } from '../runs/runner-command.ts';
import { EGRESS_DIR, SandboxHost } from '../sandbox.ts';
import { EgressProxy } from '../runs/egress-proxy.ts';
import type { SpawnedProc, Spawner } from '../spawner.ts';
import { SessionFrames, type SessionFrame } from './frames.ts';


/** What a session sandbox needs from the local runtime. */
export interface SessionSandboxDeps {
  host: SandboxHost;
  cgroups: CgroupSupport;
  spawner: Spawner;
  runsDir: string;
  runsc: string | null;
  interpreter: string;
  limitsFor(jt: JobType, memoryBytes: number): CgroupLimits;
  log: Logger;
  now(): number;
}

/** A session's sandbox: start it, run cells one at a time, close it. */
export class LocalSessionSandbox implements SessionSandbox {
  private readonly frames = new SessionFrames();
  private waiting: ((f: SessionFrame) => void) | null = null;
  private endedAs: SessionEnd | null = null;
  private readonly endListeners: ((e: SessionEnd) => void)[] = [];
  private readyResolve!: () => void;
  private readonly ready = new Promise<void>((r) => (this.readyResolve = r));
  /** Taken ready from the runtime's session pool (session-pool.ts) rather than started for its session. */
  warm = false;

  private constructor(
    private readonly d: SessionSandboxDeps,
    readonly rd: RunDir,
    private readonly cgroup: RunCgroup,
    private readonly proc: SpawnedProc,
    private readonly runscId: string | null,
    private readonly egress: EgressProxy | null,
  ) {}

  /** Host path of the session's `/workspace`. */
  get workspaceDir(): string {
    return path.join(this.rd.dir, 'workspace');
  }

  /** Starts the sandbox; resolves once the interpreter is ready, rejects when it could not start within `startupMs`. */
  static async start(d: SessionSandboxDeps, jobType: JobType, maxStreamBytes: number, startupMs: number, depsDir: string | null = null): Promise<LocalSessionSandbox> {
    const memoryBytes = parseMemory(jobType.memoryLimit);
    const rd = RunDir.create({ host: d.host, runsDir: d.runsDir, id: sandboxId('s', d.now()), program: 'later', tmpBytes: memoryBytes });
    let cgroup: RunCgroup | null = null;
    let egress: EgressProxy | null = null;
    try {
      rd.writeProgram({ code: '', inputJson: '{}' });
      const ws = rd.subdir('workspace');
      SandboxHost.ownBySandbox(ws);
      rd.mount({ type: 'rw', src: ws, dest: '/workspace' });
      // Its requirements (session-deps.ts), read-only as a run's.
      if (depsDir) rd.mount({ type: 'ro', src: depsDir, dest: '/deps' });
      cgroup = d.cgroups.create(rd.id, d.limitsFor(jobType, memoryBytes));
      // A type with allowed_hosts reaches exactly those, through a proxy of this session's own (its
      // socket mounted read-only, relayed inside by the runner), as a one-shot run does.
      egress = await openSessionEgress(rd, jobType, d.log);
      const spec = runnerSandbox({
        rd,
        interpreter: d.interpreter,
        runner: d.host.runnerFor(d.interpreter),
        jobType,
        timeoutSec: jobType.timeout,
        maxStreamBytes,
        memoryBytes,
        fileSizeBytes: parseMemory(jobType.maxFileSize),
        deps: depsDir !== null,
        egress: egress !== null,
        cgroups: true,
        inProcess: false,
        sh: d.host.waitingShell(),
        procsFiles: [],
      });
      spec.argv.push('--session', '--cwd', '/workspace');
      const launch = d.host.launch(spec, true);
      const fifos = { in: path.join(rd.dir, 'go.fifo'), out: path.join(rd.dir, 'out.fifo') };
      const proc = d.spawner.warm({ procsFiles: cgroup.procsFiles, fdFiles: launch.fdFiles, drop: d.host.privilegeDrop(), fifos });
      if (!proc) throw new Error('the spawner cannot start processes right now');
      proc.launch({ file: launch.file, args: launch.args, env: launch.env, cwd: launch.cwd });
      const s = new LocalSessionSandbox(d, rd, cgroup, proc, launch.runscId ?? null, egress);
      s.listen();
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`the session's sandbox did not start within ${startupMs} ms`)), startupMs)));
      try {
        await Promise.race([s.ready, timeout, proc.closed.then(() => Promise.reject(new Error(`the session's sandbox ended at its start: ${s.stderrTail.trim()}`)))]);
      } catch (err) {
        await s.destroy();
        throw err;
      } finally {
        clearTimeout(timer);
      }
      return s;
    } catch (err) {
      if (!(err instanceof Error && err.message.startsWith('the session'))) {
        cgroup?.killAll();
        await cgroup?.remove().catch(() => {});
        await egress?.close();
        rd.remove();
      }
      throw err;
    }
  }

  private stderrTail = '';

  private listen(): void {
    this.proc.onStdout((b) => {
      for (const f of this.frames.push(b)) {
        if (f.kind === 'ready') this.readyResolve();
        else if (f.kind === 'end') this.end(f.info.reason === 'closed' ? 'closed' : 'crashed', JSON.stringify(f.info));
        else this.waiting?.(f);
      }
    });
    this.proc.onStderr((b) => {
      this.stderrTail = (this.stderrTail + b.toString('utf8')).slice(-2000);
    });
    void this.proc.closed.then(() => this.end('crashed', `the sandbox ended: ${this.stderrTail.trim().slice(-500)}`));
  }

  private end(reason: SessionEnd['reason'], detail: string): void {
    if (this.endedAs) return;
    // A kill by the kernel's OOM killer anywhere in the session's cgroup ends it `oom`.
    const oom = this.cgroup.stats().oomKilled;
    this.endedAs = { reason: oom ? 'oom' : reason, detail };
    this.waiting?.({ kind: 'end', info: { reason } });
    for (const l of this.endListeners.splice(0)) l(this.endedAs);
  }

  /** How it ended; null while it lives. */
  get ended(): SessionEnd | null {
    return this.endedAs;
  }

  /** Called once when the sandbox ends (closed, crashed, OOM). */
  onEnd(cb: (e: SessionEnd) => void): void {
    if (this.endedAs) cb(this.endedAs);
    else this.endListeners.push(cb);
  }

  /** Runs one cell. Resolves with what happened (a crash or OOM included: the session then has ended). */
  async runCell(c: CellSpec): Promise<RawRun> {
    if (this.endedAs) return cellAfterEnd(this.endedAs, this.d.now());
    const t0 = this.d.now();
    const codePath = path.join(this.rd.dir, 'code', `cell-${c.cell}.py`);
    writeFileSync(codePath, c.code, { mode: 0o644 });
    writeFileSync(path.join(this.rd.dir, 'input', 'data.json'), c.inputJson, { mode: 0o644 });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const cut = { o: false, e: false };
    const result = await new Promise<Record<string, unknown> | null>((resolve) => {
      this.waiting = (f) => {
        if (f.kind === 'o' || f.kind === 'e') {
          (f.kind === 'o' ? out : err).push(f.data);
          c.onOutput?.(f.kind === 'o' ? 'stdout' : 'stderr', f.data);
        } else if (f.kind === 'cut') cut[f.stream] = true;
        else if (f.kind === 'result') resolve(f.result);
        else resolve(null);
      };
      this.proc.write(`${JSON.stringify({ cell: c.cell, code: `/code/cell-${c.cell}.py`, timeout: c.timeoutSec, max_stream_bytes: c.maxStdoutBytes, env: c.env ?? {} })}\n`);
    });
    this.waiting = null;
    const t1 = this.d.now();
    const stats = this.cgroup.stats();
    // The OOM killer may take a child process of the cell and spare the interpreter: the session still
    // ends `oom` (issue 19), and its memory counter would otherwise call every later cell an OOM too.
    if (stats.oomKilled && !this.endedAs) this.end('crashed', 'out of memory: a process of the session was killed by the OOM killer');
    const report = (result ?? {}) as RunnerReport;
    const ended = this.endedAs as SessionEnd | null;
    const timedOut = result ? result.timed_out === true : ended?.reason === 'crashed' && ended.detail.includes('interrupt_ignored');
    const obs = baseObservation(t0, {
      exitCode: timedOut ? null : result ? (typeof report.exit_code === 'number' ? report.exit_code : 1) : 137,
      timedOut: timedOut ? 'execution' : null,
      oomKilled: stats.oomKilled,
      oomDetectable: true,
      phase: result && report.exit_code === 0 ? 'completed' : timedOut ? 'execution' : 'failed',
      endedAt: new Date(t1),
      executionMs: typeof report.execution_ms === 'number' ? report.execution_ms : t1 - t0,
      totalMs: t1 - t0,
      ...(stats.maxRssMb !== undefined ? { maxRssMb: stats.maxRssMb } : {}),
    });
    const collected = collectOutputs(this.rd.outputDir, c.maxArtifactBytes);
    for (const e of readdirSync(this.rd.outputDir)) rmSync(path.join(this.rd.outputDir, e), { recursive: true, force: true });
    rmSync(codePath, { force: true });
    return {
      observation: obs,
      report: { ...report, exit_code: obs.exitCode, timed_out: timedOut },
      stdout: Buffer.concat(out).toString('utf8'),
      stderr: Buffer.concat(err).toString('utf8'),
      stdoutTruncated: cut.o,
      stderrTruncated: cut.e,
      ...collected,
    };
  }

  /** Ends the session's sandbox: kills everything in its cgroup and removes its traces. */
  async destroy(): Promise<void> {
    this.end('closed', 'closed by the service');
    this.cgroup.killAll();
    this.proc.kill();
    await this.proc.closed;
    if (this.runscId && this.d.runsc) await runscDelete(this.d.runsc, this.d.host.runscState, [this.runscId]).catch(() => {});
    await this.cgroup.remove().catch(() => {});
    await this.egress?.close();
    this.rd.remove();
  }
}

/** The egress proxy of a session whose job type lists allowed_hosts (null for any other type). */
async function openSessionEgress(rd: RunDir, jobType: JobType, log: Logger): Promise<EgressProxy | null> {
  const net = jobType.network;
  if (net.mode !== 'bridge' || net.allowedHosts.length === 0) return null;
  const netDir = rd.subdir('net');
  const proxy = await EgressProxy.listen(path.join(netDir, 'proxy.sock'), {
    allowedHosts: net.allowedHosts,
    onDecision: (dec) => {
      if (!dec.allowed) log.info({ session_sandbox: rd.id, host: dec.host, port: dec.port, reason: dec.reason }, 'egress refused');
    },
  });
  rd.mount({ type: 'ro', src: netDir, dest: EGRESS_DIR });
  return proxy;
}
