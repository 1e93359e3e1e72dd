/**
 * A session's sandbox on the Kubernetes runtime (issue 19): the session's own pod (session-job.ts),
 * reached through an attach to its collector (session-channel.ts). A cell: its code and input go to
 * the collector, which writes them where `main` reads them (read-only) and passes the cell to the
 * runner; the runner's frames come back, then the cell's /output as a tar archive (parsed with the
 * limits of a run's, output-tar.ts) and its result. The files API goes the same way; the collector
 * does the O_NOFOLLOW work in the pod (decisions in session-decide.ts).
 *
 * The pod outlives this process: {@link KubeSessionSandbox.adopt} attaches to a live session pod
 * again (a restarted replica), the interpreter and its state as they were.
 */
import { createHash } from 'node:crypto';
import { PassThrough } from 'node:stream';
import type { V1Pod } from '@kubernetes/client-node';
import { AppError } from '../../../errors.ts';
import type { KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import { baseObservation, contentTypeFor } from '../../run-output.ts';
import type { RawRun, RunnerReport } from '../../runtime.ts';
import { cellAfterEnd, type CellSpec, type SessionEnd, type SessionFiles, type SessionSandbox, type WorkspaceEntry } from '../../session.ts';
import { defaultOutputLimits, parseOutputTar, type CollectedOutput } from '../runs/output-tar.ts';
import { SessionChannel, type CellFrame } from './session-channel.ts';
import { answerError, podEnd, podOom, podSettled } from './session-decide.ts';

/** How long attaching again after a lost attach may take, ms. */
const REATTACH_MS = 15_000;
/**
 * How long the end of a session waits for the pod's status to tell an OOM kill, ms: until every
 * container's end is reported (podSettled), at most this (the kubelet lags on a loaded node; a
 * verdict of `crashed` for an OOM kill was seen on kcluster at load 36 with 4 s, and at load 6 with
 * 10 s). Only an end the service did not ask for waits; it is logged when the wait runs out.
 */
const OOM_SETTLE_MS = 30_000;

/** What a session sandbox needs from the runtime. */
export interface KubeSessionDeps {
  api: KubeApi;
  ns: string;
  /** The session pods as the informer has them. */
  pods: () => V1Pod[];
  now: () => number;
  log: Logger;
}

interface CellRun {
  n: number;
  out: Buffer[];
  err: Buffer[];
  cut: { o: boolean; e: boolean };
  onOutput: CellSpec['onOutput'];
  tar: PassThrough | null;
  parsing: Promise<CollectedOutput> | null;
  tarOk: boolean;
  done: (result: Record<string, unknown> | null) => void;
}

/** A session's pod, as a {@link SessionSandbox}. */
export class KubeSessionSandbox implements SessionSandbox {
  private endedAs: SessionEnd | null = null;
  private ending: Promise<void> | null = null;
  private readonly endListeners: ((e: SessionEnd) => void)[] = [];
  private cell: CellRun | null = null;
  private closing = false;
  private readyResolve!: () => void;
  private readonly ready = new Promise<void>((r) => (this.readyResolve = r));
  /** Set while a lost attach is being made again: requests wait for it. */
  private reattaching: Promise<void> | null = null;
  /** Adopted while a cell of the earlier process ran: settles when its result went by. */
  private drained: Promise<void> = Promise.resolve();
  private drainResolve: (() => void) | null = null;
  readonly files: SessionFiles;

  private constructor(
    private readonly d: KubeSessionDeps,
    readonly sessionId: string,
    readonly jobName: string,
    readonly podName: string,
    private channel: SessionChannel,
    /** Taken ready from the session pool (session-pool.ts) rather than started for this session. */
    readonly warm: boolean,
  ) {
    this.wire(channel);
    this.files = this.fileOps();
  }

  private wire(channel: SessionChannel): void {
    channel.onFrame = (f) => this.frame(f);
    channel.onLost = (why) => void this.reattach(why);
  }

  /**
   * The attach ended but the pod may live on (an API server or kubelet restart cuts attaches): attach
   * again, as an adopter would. A cell whose result went by unheard meanwhile cannot be answered: the
   * session then ends `crashed`, as it does when the pod is gone.
   */
  private reattach(why: string): Promise<void> {
    if (this.closing || this.endedAs) return Promise.resolve();
    const p = this.attachAgain(why).finally(() => {
      if (this.reattaching === p) this.reattaching = null;
    });
    this.reattaching = p;
    return p;
  }

  private async attachAgain(why: string): Promise<void> {
    if (podEnd(this.pod()) === 'attachable') {
      try {
        const { channel, hello } = await SessionChannel.open(this.d.api, this.d.ns, this.podName, this.d.now() + REATTACH_MS, this.d.now);
        const lostCell = this.cell !== null && hello.busy !== this.cell.n;
        if (!hello.ended && !lostCell && !this.closing) {
          this.channel = channel;
          this.wire(channel);
          this.d.log.info({ session_id: this.sessionId, pod: this.podName, why }, 'attached to the session pod again');
          return;
        }
        channel.close();
        if (lostCell) why = `${why}; the running cell's result went by while detached`;
      } catch (err) {
        why = `${why}; attaching again failed: ${String(err)}`;
      }
    }
    await this.end('crashed', why);
  }

  /** Attaches to `pod` (held by Job `jobName`) and waits for its runner (`deadline`, epoch ms); rejects when it cannot. */
  static async connect(d: KubeSessionDeps, sessionId: string, jobName: string, podName: string, deadline: number, warm = false): Promise<KubeSessionSandbox> {
    const { channel, hello } = await SessionChannel.open(d.api, d.ns, podName, deadline, d.now);
    const s = new KubeSessionSandbox(d, sessionId, jobName, podName, channel, warm);
    if (hello.ended) {
      await s.end('crashed', `the session's runner had ended: ${JSON.stringify(hello.ended)}`);
      return s;
    }
    if (hello.ready === true) s.readyResolve();
    if (typeof hello.busy === 'number') {
      s.drained = new Promise<void>((r) => (s.drainResolve = r));
      s.readyResolve();
    }
    let timer: NodeJS.Timeout | undefined;
    const left = Math.max(1, deadline - d.now());
    try {
      await Promise.race([
        s.ready,
        new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`the session's runner was not ready within ${left} ms`)), left))),
        new Promise<never>((_, rej) => s.onEnd((e) => rej(new Error(`the session's sandbox ended at its start: ${e.detail}`)))),
      ]);
    } catch (err) {
      channel.close();
      throw err;
    } finally {
      clearTimeout(timer);
    }
    return s;
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

  private pod(): V1Pod | undefined {
    return this.d.pods().find((p) => p.metadata?.name === this.podName);
  }

  /** Ends it: an OOM kill shows in the pod's status a moment later, so that is waited for (bounded). */
  private end(reason: SessionEnd['reason'], detail: string): Promise<void> {
    if (this.endedAs) return Promise.resolve();
    if (this.ending) return this.ending;
    this.ending = (async () => {
      let oom = false;
      if (!this.closing) {
        const until = this.d.now() + OOM_SETTLE_MS;
        for (;;) {
          oom = podOom(this.pod());
          if (oom || podSettled(this.pod())) break;
          if (this.d.now() >= until) {
            this.d.log.warn({ session_id: this.sessionId, pod: this.podName, containers: this.pod()?.status?.containerStatuses?.map((c) => ({ name: c.name, state: c.state })) ?? null }, 'the session pod\'s status did not settle in time; ending it without an OOM verdict');
            break;
          }
          await new Promise((r) => setTimeout(r, 100));
        }
      }
      this.endedAs = { reason: oom ? 'oom' : this.closing ? 'closed' : reason, detail };
      this.cell?.done(null);
      this.drainResolve?.();
      for (const l of this.endListeners.splice(0)) l(this.endedAs);
    })();
    return this.ending;
  }

  private frame(f: CellFrame): void {
    if (f.kind === 'ready') return this.readyResolve();
    if (f.kind === 'end') {
      const why = typeof f.info.reason === 'string' ? f.info.reason : 'ended';
      void this.end(why === 'closed' ? 'closed' : 'crashed', JSON.stringify(f.info));
      return;
    }
    const c = this.cell;
    if (!c) {
      // The result of a cell an earlier process started (adoption): its record is that process's.
      if (f.kind === 'result') this.drainResolve?.();
      return;
    }
    if (f.kind === 'o' || f.kind === 'e') {
      (f.kind === 'o' ? c.out : c.err).push(f.data);
      c.onOutput?.(f.kind === 'o' ? 'stdout' : 'stderr', f.data);
    } else if (f.kind === 'cut') c.cut[f.stream] = true;
    else if (f.kind === 'tar') c.tar?.write(f.data);
    else if (f.kind === 'tarEnd') {
      c.tarOk = f.info.ok === true;
      c.tar?.end();
    } else if (f.kind === 'result') c.done(f.result);
  }

  /** Runs one cell. Resolves with what happened (a crash or OOM included: the session then has ended). */
  async runCell(c: CellSpec): Promise<RawRun> {
    await this.reattaching;
    await this.drained;
    if (this.endedAs) return cellAfterEnd(this.endedAs, this.d.now());
    const t0 = this.d.now();
    const tar = new PassThrough();
    const parsing = parseOutputTar(tar, defaultOutputLimits(c.maxArtifactBytes, c.maxStdoutBytes)).finally(() => tar.resume());
    parsing.catch(() => undefined);
    const result = await new Promise<Record<string, unknown> | null>((resolve) => {
      this.cell = { n: c.cell, out: [], err: [], cut: { o: false, e: false }, onOutput: c.onOutput, tar, parsing, tarOk: false, done: resolve };
      const go = { timeout: c.timeoutSec, max_stream_bytes: c.maxStdoutBytes, env: c.env ?? {} };
      this.channel.send({ op: 'cell', cell: c.cell, code: c.code, input: c.inputJson, go }).catch((err: unknown) => void this.end('crashed', `the cell could not be sent: ${String(err)}`));
    });
    const run = this.cell!;
    this.cell = null;
    if (!tar.writableEnded) tar.end();
    const collected = run.tarOk ? await parsing.catch(() => null) : null;
    const t1 = this.d.now();
    if (!result) await this.ending;
    const report = (result ?? {}) as RunnerReport;
    const ended = this.endedAs as SessionEnd | null;
    const timedOut = result ? result.timed_out === true : ended?.reason === 'crashed' && ended.detail.includes('interrupt_ignored');
    const oom = ended?.reason === 'oom';
    const obs = baseObservation(t0, {
      exitCode: timedOut ? null : result ? (typeof report.exit_code === 'number' ? report.exit_code : 1) : 137,
      timedOut: timedOut ? 'execution' : null,
      oomKilled: oom,
      // The end of the session read the pod's status for an OOM kill (end()): a runner gone without
      // one was killed otherwise (a signal, the pod deleted), which is `killed`, not `oom`.
      oomDetectable: true,
      phase: result && report.exit_code === 0 ? 'completed' : timedOut ? 'execution' : 'failed',
      endedAt: new Date(t1),
      executionMs: typeof report.execution_ms === 'number' ? report.execution_ms : t1 - t0,
      totalMs: t1 - t0,
    });
    return {
      observation: obs,
      report: { ...report, exit_code: obs.exitCode, timed_out: timedOut },
      stdout: Buffer.concat(run.out).toString('utf8'),
      stderr: Buffer.concat(run.err).toString('utf8'),
      stdoutTruncated: run.cut.o,
      stderrTruncated: run.cut.e,
      resultJson: collected?.resultJson ?? null,
      resultJsonTooLarge: collected?.resultJsonTooLarge ?? false,
      artifacts: collected?.artifacts ?? [],
      artifactsTotal: collected?.artifactsTotal ?? 0,
      artifactsTruncated: collected?.artifactsTruncated ?? false,
    };
  }

  private fileOps(): SessionFiles {
    // An ended sandbox is the API's 409 (as an ended session is); an attach lost under the request
    // (an API server restart: it is being made again) a 503 to try again. Neither is a 500.
    const ended = (e: SessionEnd) => new AppError('conflict', `the session's sandbox has ended (${e.reason})`);
    const ask = async (req: Record<string, unknown>) => {
      await this.reattaching;
      if (this.endedAs) throw ended(this.endedAs);
      const a = await this.channel.request(req).catch((err: unknown) => {
        throw this.endedAs ? ended(this.endedAs) : new AppError('service_unavailable', `the session's sandbox could not be reached (${err instanceof Error ? err.message : String(err)}); try again`);
      });
      if (a.reply.ok !== true) throw answerError(a.reply);
      return a;
    };
    return {
      list: async () => ((await ask({ op: 'list' })).reply.items ?? []) as WorkspaceEntry[],
      read: async (name, maxBytes, withData) => {
        const a = await ask({ op: 'read', name, max: maxBytes, data: true });
        const data = a.data ?? Buffer.alloc(0);
        return { data: withData ? data : null, size: data.length, sha256: createHash('sha256').update(data).digest('hex'), contentType: contentTypeFor(name) };
      },
      write: async (name, data, maxBytes) => {
        const a = await ask({ op: 'write', name, max: maxBytes, b64: data.toString('base64') });
        return { size: data.length, sha256: createHash('sha256').update(data).digest('hex'), created: a.reply.created === true };
      },
      remove: async (name) => {
        await ask({ op: 'delete', name });
      },
    };
  }

  /** Ends the session's pod: the collector told to close, the Job deleted (its pod goes with it). */
  async destroy(): Promise<void> {
    this.closing = true;
    await this.channel.send({ op: 'close' }).catch(() => undefined);
    this.channel.close();
    await this.end('closed', 'closed by the service');
    await this.d.api.deleteJob(this.d.ns, this.jobName).catch((err: unknown) => this.d.log.warn({ session_id: this.sessionId, job: this.jobName, err: String(err) }, 'could not delete the session Job'));
  }

  /** Lets go of the pod without ending it (this process stops; another adopts the session). */
  release(): void {
    this.channel.onLost = () => undefined;
    this.channel.close();
  }
}
