/**
 * A run's event stream (issue 12, `GET /jobs/{id}/events`; contract in docs/api.md).
 *
 * Written by the process holding the run ({@link RunEventWriter}): phase changes and output chunks go
 * to the `execution_events` table, capped per stream at `max_stdout_bytes` like the record, and a
 * NOTIFY on {@link EVENTS_CHANNEL} wakes readers in every process. Read by any replica
 * ({@link EventFeed}): a reader pages through the table after the client's last event id, one page at
 * a time and only when the previous one was written to the client, so a slow client holds one page
 * of memory, never the run's output. The record stays the truth: the final `status`, `artifact` and
 * `end` events are made from it when it is terminal (ids continue after the stored ones, so they are
 * the same on every read), and a run that stored no output (finished before this existed, or a
 * runtime that reports none) gets its output from the record.
 *
 * Ids: id 0 is the record's creation (synthesized, `queued`, or `starting` for a sync run), stored
 * events carry their row id (increasing per run: one holder writes a run at a time), the terminal
 * tail follows the largest stored id.
 */
import type { Clock } from '../clock.ts';
import type { Logger } from '../logger.ts';
import { DONE_CHANNEL } from '../queue/channels.ts';
import { listArtifacts } from '../store/artifacts.repository.ts';
import type { Db, ExecutionRow } from '../store/database.ts';
import { appendEvents, eventsAfter, eventsSummary, storedOutput, type NewRunEvent } from '../store/events.repository.ts';
import { getExecution } from '../store/executions.repository.ts';
import { stringifyJson } from '../util/json.ts';
import { isTerminal } from './status.ts';
import { recordView } from './views.ts';

/** Events of a run were stored (payload: its id). A hint, like every channel (queue/channels.ts). */
export const EVENTS_CHANNEL = 'sandpod_events';

/** Phases a `status` event names. */
export type EventPhase = 'queued' | 'starting' | 'installing' | 'running' | 'finished';

/** The output streams. */
export type OutputStream = 'stdout' | 'stderr';

/** Longest text of one stored output event, characters. */
const CHUNK_CHARS = 16 * 1024;
/** Events read from the table per page (each at most {@link CHUNK_CHARS} of output). */
const PAGE = 32;
/** How long a status change waits to be written with what follows it, ms: unnoticeable to a watcher. */
const STATUS_FLUSH_MS = 20;
/** Keep-alive comment interval, ms (the contract's 15 s). */
export const PING_MS = 15_000;
/** Readers re-check the table this often even without a notification (a lost NOTIFY costs this much). */
const POLL_MS = 2_000;

const iso = (ms: number | Date | string) => new Date(ms).toISOString();

/** Options of {@link RunEventWriter}. */
export interface RunEventWriterOptions {
  db: Db;
  executionId: string;
  /** Cap per stream, bytes (the record's `max_stdout_bytes`). */
  maxBytes: number;
  clock: Clock;
  logger: Logger;
  /** How long output may wait to be batched into one write, ms. */
  flushMs?: number;
  /** How long a status change may wait to be batched, ms (default {@link STATUS_FLUSH_MS}). */
  statusFlushMs?: number;
}

/**
 * Writes one run's events while this process holds it. Best effort: a failed write is logged and
 * dropped (the record, written separately, is the truth and ends every stream). Memory is bounded by
 * the per-stream cap: output past it is dropped as it arrives.
 */
export class RunEventWriter {
  private pending: NewRunEvent[] = [];
  /** The stream of the last pending event when it is output text still open for appending. */
  private openText: { stream: OutputStream; text: string } | null = null;
  private readonly bytes = { stdout: 0, stderr: 0 };
  /** Bytes still to drop from the start of each stream (output stored before an adoption). */
  private readonly skip = { stdout: 0, stderr: 0 };
  private readonly truncated = { stdout: false, stderr: false };
  private readonly decoders = { stdout: new TextDecoder('utf-8', { ignoreBOM: true }), stderr: new TextDecoder('utf-8', { ignoreBOM: true }) };
  private timer: NodeJS.Timeout | null = null;
  private timerAt = 0;
  private chain: Promise<void> = Promise.resolve();
  private closed = false;
  private warned = false;
  private readonly startedAt: number;
  private phaseAt: Partial<Record<EventPhase, number>> = {};

  constructor(private readonly o: RunEventWriterOptions) {
    this.startedAt = o.clock.now();
  }

  /** A status/phase change; written at once. `timing` says how long the earlier phases took. */
  status(status: string, phase: EventPhase, createdAt?: Date | string | null): void {
    if (this.closed) return;
    const now = this.o.clock.now();
    this.phaseAt[phase] = now;
    const timing: Record<string, number> = {};
    if (phase === 'starting' && createdAt) timing.queued_ms = Math.max(0, now - new Date(createdAt).getTime());
    if (phase === 'installing' || phase === 'running') timing.startup_ms = Math.max(0, now - this.startedAt);
    if (phase === 'running' && this.phaseAt.installing !== undefined) timing.dep_install_ms = Math.max(0, now - this.phaseAt.installing);
    this.push({ kind: 'status', data: JSON.stringify({ status, phase, at: iso(now), timing }) });
    // Soon, not at once: a short run's phases and output then go in one write (or with its verdict).
    this.flushSoon(this.o.statusFlushMs ?? STATUS_FLUSH_MS);
  }

  /**
   * Picks up a run another process held (adoption after a restart): the runtime delivers its output
   * from the start again (a cluster run's log is followed from its beginning), so as many bytes as the
   * stored output events hold are skipped, and the per-stream cap counts them. The count is of the
   * stored (decoded) text, so output with invalid UTF-8 may be skipped a few bytes off.
   */
  async resume(): Promise<void> {
    try {
      const stored = await storedOutput(this.o.db.kysely, this.o.executionId);
      for (const s of ['stdout', 'stderr'] as const) {
        const n = stored.texts[s].reduce((sum, t) => sum + Buffer.byteLength(t, 'utf8'), 0);
        this.skip[s] = n;
        this.bytes[s] = n;
      }
      for (const s of stored.truncated) this.truncated[s] = true;
    } catch (err) {
      this.o.logger.warn({ execution_id: this.o.executionId, err: String(err) }, 'stored run events could not be read; output may repeat');
    }
  }

  /** Bytes the program wrote to a stream; decoded as the record decodes (UTF-8, invalid → U+FFFD). */
  output(stream: OutputStream, chunk: Uint8Array): void {
    if (this.skip[stream] > 0 && chunk.length > 0) {
      const drop = Math.min(this.skip[stream], chunk.length);
      this.skip[stream] -= drop;
      chunk = chunk.subarray(drop);
    }
    if (this.closed || this.truncated[stream] || chunk.length === 0) return;
    const room = this.o.maxBytes - this.bytes[stream];
    const take = chunk.length > room ? chunk.subarray(0, Math.max(0, room)) : chunk;
    this.bytes[stream] += take.length;
    let text = this.decoders[stream].decode(take, { stream: true });
    if (take.length < chunk.length) text += this.decoders[stream].decode();
    this.appendText(stream, text);
    if (take.length < chunk.length) {
      this.truncated[stream] = true;
      this.push({ kind: 'truncated', data: JSON.stringify({ stream }) });
    }
    this.flushSoon(this.o.flushMs ?? 100);
  }

  /**
   * The record says a stream was cut (a runtime that caps before handing output over sends no byte
   * past the cap): one `truncated` event, unless one was written already.
   */
  markTruncated(stream: OutputStream): void {
    if (this.closed || this.truncated[stream]) return;
    this.appendText(stream, this.decoders[stream].decode());
    this.truncated[stream] = true;
    this.push({ kind: 'truncated', data: JSON.stringify({ stream }) });
  }

  /** Writes what is pending (the decoders' tails too) and stops; resolves when written. */
  async close(): Promise<void> {
    if (this.closed) return this.chain;
    this.end();
    this.flushNow();
    await this.chain;
  }

  /**
   * Stops, waits for the writes in flight, and hands back what is still pending (the decoders' tails
   * too) instead of writing it: the caller stores it with the run's verdict, in the same statement
   * (settleRunning), which saves a round trip on every run's critical path.
   */
  async closeForSettle(): Promise<NewRunEvent[]> {
    if (this.closed) {
      await this.chain;
      return [];
    }
    this.end();
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const rest = this.pending;
    this.pending = [];
    this.openText = null;
    await this.chain;
    return rest;
  }

  private end(): void {
    for (const s of ['stdout', 'stderr'] as const) if (!this.truncated[s]) this.appendText(s, this.decoders[s].decode());
    this.closed = true;
  }

  private appendText(stream: OutputStream, text: string): void {
    if (!text) return;
    const open = this.openText;
    if (open && open.stream === stream && open.text.length < CHUNK_CHARS) {
      const room = CHUNK_CHARS - open.text.length;
      open.text += text.slice(0, room);
      this.pending[this.pending.length - 1] = { kind: stream, data: JSON.stringify({ data: open.text }) };
      text = text.slice(room);
    }
    for (let i = 0; i < text.length; i += CHUNK_CHARS) {
      const piece = text.slice(i, i + CHUNK_CHARS);
      this.push({ kind: stream, data: JSON.stringify({ data: piece }) });
      this.openText = { stream, text: piece };
    }
  }

  private push(e: NewRunEvent): void {
    this.pending.push(e);
    if (e.kind !== 'stdout' && e.kind !== 'stderr') this.openText = null;
  }

  private flushSoon(ms: number): void {
    if (ms === 0) {
      this.flushNow();
      return;
    }
    // A pending write is brought forward, never put off.
    const at = this.o.clock.now() + ms;
    if (this.timer && this.timerAt <= at) return;
    if (this.timer) clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => this.flushNow(), ms);
    this.timer.unref?.();
  }

  private flushNow(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.pending.length === 0) return;
    const batch = this.pending;
    this.pending = [];
    this.openText = null;
    const { db, executionId, logger } = this.o;
    this.chain = this.chain.then(async () => {
      try {
        await appendEvents(db.kysely, executionId, batch);
        await db.notify(EVENTS_CHANNEL, executionId).catch(() => {});
      } catch (err) {
        if (!this.warned) logger.warn({ execution_id: executionId, err: String(err), events: batch.length }, 'run events could not be stored; dropped (said once per run)');
        this.warned = true;
      }
    });
  }
}

/** One thing to send: an event, or a keep-alive comment. */
export type FeedItem = { id: string; event: string; data: string } | { ping: true };

/**
 * Reads run events for clients, in any process: one LISTEN per channel per process, fanned out to
 * the streams waiting on a run.
 */
export class EventFeed {
  private readonly waiters = new Map<string, Set<() => void>>();
  private unlisten: (() => Promise<void>)[] = [];
  /** Bytes of event data read from the store and handed to streams so far (tests, diagnostics). */
  dataBytesRead = 0;
  private stopped = false;

  constructor(
    private readonly db: Db,
    private readonly opts: { pingMs?: number; pollMs?: number } = {},
  ) {}

  async start(): Promise<void> {
    const wake = (id: string) => {
      for (const w of this.waiters.get(id) ?? []) w();
    };
    this.unlisten.push(await this.db.listen(EVENTS_CHANNEL, wake), await this.db.listen(DONE_CHANNEL, wake));
  }

  /**
   * Ends every open stream (shutdown): their clients reconnect with `Last-Event-ID`, to another replica
   * or to this one once it is back, and miss nothing.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const u of this.unlisten.splice(0)) await u().catch(() => {});
    for (const set of this.waiters.values()) for (const w of set) w();
  }

  /**
   * The events of run `id` after `afterId` (-1: from the start), ending with `end` once the record is
   * terminal. Pulled: the next page is read only when the caller asks for the next item.
   */
  async *stream(row: ExecutionRow, afterId: number, signal?: AbortSignal): AsyncGenerator<FeedItem> {
    const id = row.id;
    let wake!: () => void;
    let woken = false;
    let wakeUp: Promise<void> = new Promise((r) => (wake = r));
    const onWake = () => {
      woken = true;
      wake();
    };
    let set = this.waiters.get(id);
    if (!set) this.waiters.set(id, (set = new Set()));
    set.add(onWake);
    signal?.addEventListener('abort', onWake);
    const pingMs = this.opts.pingMs ?? PING_MS;
    try {
      let last = afterId;
      if (last < 0) {
        yield { id: '0', event: 'status', data: JSON.stringify(creationStatus(row)) };
        last = 0;
      }
      let lastSent = Date.now();
      while (!signal?.aborted && !this.stopped) {
        // Subscribed before reading: a write after this read wakes the wait below.
        woken = false;
        const page = await eventsAfter(this.db.kysely, id, last, PAGE);
        for (const e of page) {
          this.dataBytesRead += e.data.length;
          yield { id: String(e.id), event: e.kind, data: e.data };
          last = e.id;
          lastSent = Date.now();
        }
        if (page.length === PAGE) continue;
        const now = await getExecution(this.db.kysely, id);
        if (!now) return;
        if (isTerminal(now.status)) {
          // Output is stored before the record is settled: what the read above missed is there now.
          if ((await eventsAfter(this.db.kysely, id, last, 1)).length > 0) continue;
          for (const e of await this.tail(now)) if (Number(e.id) > last) yield e;
          return;
        }
        if (!woken) {
          const waitMs = Math.min(this.opts.pollMs ?? POLL_MS, Math.max(1, lastSent + pingMs - Date.now()));
          let timer: NodeJS.Timeout | undefined;
          await Promise.race([wakeUp, new Promise<void>((r) => (timer = setTimeout(r, waitMs)))]);
          clearTimeout(timer);
        }
        wakeUp = new Promise((r) => (wake = r));
        if (!woken && Date.now() - lastSent >= pingMs) {
          yield { ping: true };
          lastSent = Date.now();
        }
      }
    } finally {
      signal?.removeEventListener('abort', onWake);
      set.delete(onWake);
      if (set.size === 0) this.waiters.delete(id);
    }
  }

  /** The terminal events, made from the record; ids after the run's largest stored id. */
  private async tail(row: ExecutionRow): Promise<{ id: string; event: string; data: string }[]> {
    const { maxId, hasOutput } = await eventsSummary(this.db.kysely, row.id);
    const arts = await listArtifacts(this.db.kysely, row.id);
    const record = recordView(row, true, arts);
    const out: { event: string; data: string }[] = [];
    if (!hasOutput) {
      for (const s of ['stdout', 'stderr'] as const) {
        const text = (record[s] as string | null) ?? '';
        for (let i = 0; i < text.length; i += CHUNK_CHARS) out.push({ event: s, data: JSON.stringify({ data: text.slice(i, i + CHUNK_CHARS) }) });
        if (record[`${s}_truncated`] === true) out.push({ event: 'truncated', data: JSON.stringify({ stream: s }) });
      }
    }
    out.push({
      event: 'status',
      data: stringifyJson({ status: row.status, phase: 'finished', at: iso(row.ended_at ?? row.created_at), ...(record.timing ? { timing: record.timing } : {}) }),
    });
    for (const a of (record.artifacts as unknown[] | undefined) ?? []) out.push({ event: 'artifact', data: stringifyJson(a) });
    out.push({ event: 'end', data: stringifyJson(record) });
    return out.map((e, i) => ({ id: String(maxId + 1 + i), ...e }));
  }
}

/** Event 0: the record as it was created (async: queued; sync: starting at once). */
function creationStatus(row: ExecutionRow): Record<string, unknown> {
  const sync = row.mode === 'sync';
  return { status: sync ? 'running' : 'queued', phase: sync ? 'starting' : 'queued', at: iso(row.created_at), timing: {} };
}
