/**
 * The service's end of a session pod's channel (issue 19): an attach to its `collector`
 * (session-collector.py), requests as JSON lines on its stdin, answers as frames on its stdout.
 *
 * An attach sees the container's stdout from the moment it opens, so possibly mid-frame (a restarted
 * service attaching to a pod another process started). Every attach therefore opens with `hello`
 * and a random sync word: nothing before the line `sync WORD` is read, and framing starts after it.
 * The word is known to this process and the collector only (the cells run in another container and
 * never see the collector's streams), so nothing a cell prints can fake it. A request line cut off
 * by an earlier attacher is ended by the `\n` this one sends first, and the collector drops it.
 *
 * Who may attach is the API server's to say (RBAC `pods/attach` in the runs namespace: the service
 * only); nothing in the pod accepts a connection from outside.
 */
import { randomBytes } from 'node:crypto';
import { upgradeRefused, type AttachSession, type KubeApi } from '../../../kube/index.ts';
import { parseObject, SessionFrames, type SessionFrame } from '../../local/session/frames.ts';
import { CONTAINERS } from '../names.ts';

/** The collector's kinds beside the runner's: `f` answer, `d` file data, `a` outputs tar, `A` its end. */
const COLLECTOR_KINDS = 'fdaA';
/** Largest collector frame: a listing of many files is one `f`. */
const MAX_COLLECTOR_FRAME = 16 << 20;

/** A frame of the cell stream (the runner's, plus the outputs archive). */
export type CellFrame = SessionFrame | { kind: 'tar'; data: Buffer } | { kind: 'tarEnd'; info: Record<string, unknown> };

/** A collector's answer to a request, with the file's bytes when it sends them. */
export interface Answer {
  reply: Record<string, unknown>;
  data: Buffer | null;
}

interface Pending {
  resolve: (a: Answer) => void;
  reject: (err: Error) => void;
  reply?: Record<string, unknown>;
  chunks?: Buffer[];
  left?: number;
}

/** One attach to a session pod's collector. */
export class SessionChannel {
  private readonly frames = new SessionFrames(COLLECTOR_KINDS, MAX_COLLECTOR_FRAME);
  private readonly sync = `s${randomBytes(16).toString('hex')}`;
  private pre: Buffer | null = Buffer.alloc(0);
  private readonly pending: Pending[] = [];
  private lostWhy: string | null = null;
  private frameHandler: ((f: CellFrame) => void) | null = null;
  /** Frames that came before a handler was set (the runner's `ready` may follow the hello's answer at once). */
  private early: CellFrame[] = [];
  /** Called once when the attach ends (the pod or its collector went, or {@link close}). */
  onLost: (why: string) => void = () => undefined;

  private constructor(private session: AttachSession | null) {}

  /**
   * Attaches (tried again while the container is not running yet, until `deadline`), says hello and
   * resolves with the collector's state: `ready` (the runner said so), `busy` (a cell number), `ended`.
   */
  static async open(api: Pick<KubeApi, 'attach'>, ns: string, pod: string, deadline: number, now: () => number): Promise<{ channel: SessionChannel; hello: Record<string, unknown> }> {
    const ch = new SessionChannel(null);
    for (;;) {
      try {
        ch.session = await api.attach(ns, pod, CONTAINERS.collector, (b) => ch.feed(b));
        break;
      } catch (err) {
        if (!upgradeRefused(err) || now() >= deadline) throw err;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    void ch.session.ended.then(() => ch.lose('the attach to the session pod ended'));
    const hello = ch.request({ op: 'hello', sync: ch.sync }, '\n');
    const left = Math.max(1, deadline - now());
    let timer: NodeJS.Timeout | undefined;
    try {
      const a = await Promise.race([hello, new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`the session pod's collector did not answer within ${left} ms`)), left)))]);
      return { channel: ch, hello: a.reply };
    } catch (err) {
      ch.close();
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Receives the frames of the running cell, and the runner's `ready` and `x` (those that came earlier first). */
  set onFrame(handler: (f: CellFrame) => void) {
    this.frameHandler = handler;
    for (const f of this.early.splice(0)) handler(f);
  }

  private emit(f: CellFrame): void {
    if (this.frameHandler) this.frameHandler(f);
    else this.early.push(f);
  }

  /** Why the channel is gone; null while it is open. */
  get lost(): string | null {
    return this.lostWhy;
  }

  /** Sends one request and resolves with its answer (requests are answered in order). */
  request(req: Record<string, unknown>, prefix = ''): Promise<Answer> {
    if (this.lostWhy) return Promise.reject(new Error(this.lostWhy));
    return new Promise<Answer>((resolve, reject) => {
      this.pending.push({ resolve, reject });
      this.send(req, prefix).catch((err: unknown) => this.lose(`could not write to the session pod: ${String(err)}`));
    });
  }

  /** Sends one request that has no answer of its own (a cell: its frames come through {@link onFrame}). */
  async send(req: Record<string, unknown>, prefix = ''): Promise<void> {
    if (this.lostWhy || !this.session) throw new Error(this.lostWhy ?? 'not attached');
    await this.session.send(prefix + JSON.stringify(req) + '\n');
  }

  /** Ends the attach (the collector and the session go on: another attach may come). */
  close(): void {
    this.session?.close();
    this.lose('closed');
  }

  private lose(why: string): void {
    if (this.lostWhy) return;
    this.lostWhy = why;
    for (const p of this.pending.splice(0)) p.reject(new Error(why));
    this.onLost(why);
  }

  private feed(chunk: Buffer): void {
    if (this.pre) {
      // Before the sync line: the middle of whatever the collector wrote before this attach.
      this.pre = Buffer.concat([this.pre, chunk]);
      const marker = Buffer.from(`sync ${this.sync}\n`);
      const at = this.pre.indexOf(marker);
      if (at < 0) {
        this.pre = this.pre.subarray(Math.max(0, this.pre.length - marker.length));
        return;
      }
      chunk = this.pre.subarray(at + marker.length);
      this.pre = null;
    }
    for (const f of this.frames.push(chunk)) this.dispatch(f);
  }

  private dispatch(f: SessionFrame): void {
    if (f.kind !== 'extra') return this.emit(f);
    if (f.k === 'a') return this.emit({ kind: 'tar', data: f.data });
    if (f.k === 'A') return this.emit({ kind: 'tarEnd', info: parseObject(f.data) });
    const head = this.pending[0];
    if (!head) return;
    if (f.k === 'f') {
      const reply = parseObject(f.data);
      const size = typeof reply.size === 'number' ? reply.size : 0;
      if (reply.ok === true && reply.with_data === true && size > 0) {
        Object.assign(head, { reply, chunks: [], left: size });
        return;
      }
      this.pending.shift();
      head.resolve({ reply, data: reply.with_data === true ? Buffer.alloc(0) : null });
    } else if (f.k === 'd' && head.chunks && head.left !== undefined) {
      head.chunks.push(f.data);
      head.left -= f.data.length;
      if (head.left <= 0) {
        this.pending.shift();
        head.resolve({ reply: head.reply!, data: Buffer.concat(head.chunks) });
      }
    }
  }
}
