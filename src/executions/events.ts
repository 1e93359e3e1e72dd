/**
 * A run's event stream (issue 12, `GET /jobs/{id}/events`; contract in docs/api.md).
 *
 * Written by the process holding the run ({@link RunEventWriter}): phase changes and output chunks go
 * to the `execution_events` table, capped per stream at `max_stdout_bytes` like the record, and a
 * NOTIFY on {@link EVENTS_CHANNEL} wakes readers in every process. Read by any replica
 * (event-feed.ts: one reader per watched run, fanned out to its streams). The record stays the truth:
 * the final `status`, `artifact` and `end` events are made from it when it is terminal (ids continue
 * after the stored ones, so they are the same on every read), and a run that stored no output
 * (finished before this existed, or a runtime that reports none) gets its output from the record.
 *
 * Ids: id 0 is the record's creation (synthesized, `queued`, or `starting` for a sync run), stored
 * events carry their row id (increasing per run: one holder writes a run at a time), the terminal
 * tail follows the largest stored id.
 */
import type { Clock } from '../clock.ts';
import type { Logger } from '../logger.ts';
import type { Db } from '../store/database.ts';
import { appendEvents, storedOutput, type NewRunEvent } from '../store/events.repository.ts';

/** Events of a run were stored (payload: its id). A hint, like every channel (queue/channels.ts). */
export const EVENTS_CHANNEL = 'sandpod_events';

/** Phases a `status` event names. */
export type EventPhase = 'queued' | 'starting' | 'installing' | 'running' | 'finished';

/** The output streams. */
export type OutputStream = 'stdout' | 'stderr';

/** Longest text of one stored output event, characters. */
export const CHUNK_CHARS = 16 * 1024;
/** How long a status change waits to be written with what follows it, ms: unnoticeable to a watcher. */
const STATUS_FLUSH_MS = 20;
/** Keep-alive comment interval, ms (the contract's 15 s). */
export const PING_MS = 15_000;

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
