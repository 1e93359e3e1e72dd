/**
 * A session's event stream (`GET /sessions/{id}/events`, issue 19; contract in docs/api.md): its
 * cells one after another, each as its own run's event stream (executions/event-feed.ts, which this
 * reuses rather than repeats), renamed and tagged with the cell, then an `end` event with the session
 * once it has ended and its last cell has been streamed.
 *
 * - A cell's events: `cell` (it started: execution_id, cell, at), its `status` / `stdout` / `stderr` /
 *   `truncated` / `artifact` events with `execution_id` and `cell` added to each, and `cell_end` (its
 *   full record, as the run's `end`).
 * - Ids are `{cell}:{run event id}` (the run's ids restart with each cell), and the session's `end` is
 *   `{last cell}:end`. `Last-Event-ID` resumes after any of them.
 * - Between cells the stream waits for a notification on {@link SESSIONS_CHANNEL} (the process holding
 *   the session sends one when a cell's record exists and when the session ends), or re-reads every
 *   `pollMs` (a lost NOTIFY costs that much), sending `: ping` every 15 s like the run stream.
 */
import type { EventFeed, FeedItem } from '../executions/event-feed.ts';
import { PING_MS } from '../executions/events.ts';
import { AppError } from '../errors.ts';
import type { Db } from '../store/database.ts';
import { getSession, nextCellRecord } from '../store/sessions.repository.ts';
import { sessionView } from './views.ts';

/** Something happened to a session (a cell's record exists, or it ended); payload: its id. */
export const SESSIONS_CHANNEL = 'sandpod_sessions';

/** Where a stream resumes: after event `id` of cell `cell` (`id` -1: the cell from its start), or after the end. */
export type SessionResume = { cell: number; id: number } | { end: true };

/** Parses `Last-Event-ID` for a session stream; absent → from the first cell; anything malformed → 400. */
export function parseSessionResume(raw: string | undefined): SessionResume {
  if (raw === undefined || raw.trim() === '') return { cell: 1, id: -1 };
  const t = raw.trim();
  const m = /^([0-9]{1,9}):([0-9]{1,15}|end)$/.exec(t);
  if (!m) throw new AppError('validation_error', `Last-Event-ID: expected a session event id ('{cell}:{id}' or '{cell}:end'), got '${t.slice(0, 40)}'`);
  if (m[2] === 'end') return { end: true };
  return { cell: Number(m[1]), id: Number(m[2]) };
}

/** Session streams of this process: the listener for {@link SESSIONS_CHANNEL} and the streams' waits. */
export class SessionStreams {
  private readonly waiters = new Map<string, Set<() => void>>();
  private unlisten: (() => Promise<void>) | null = null;
  private readonly pollMs: number;
  private readonly pingMs: number;

  constructor(
    private readonly db: Db,
    opts: { pollMs?: number; pingMs?: number } = {},
  ) {
    this.pollMs = opts.pollMs ?? 2_000;
    this.pingMs = opts.pingMs ?? PING_MS;
  }

  async start(): Promise<void> {
    this.unlisten = await this.db.listen(SESSIONS_CHANNEL, (id) => this.wake(id));
  }

  async stop(): Promise<void> {
    const u = this.unlisten;
    this.unlisten = null;
    if (u) await u().catch(() => {});
  }

  /** Tells every process's streams of session `id` to look again (and this process's at once). */
  notify(id: string): void {
    this.wake(id);
    void this.db.notify(SESSIONS_CHANNEL, id).catch(() => {});
  }

  private wake(id: string): void {
    for (const w of this.waiters.get(id) ?? []) w();
  }

  /** A wait for the next wake of `id`, armed before the reads it follows so no wake falls between. */
  private arm(id: string): { wait: (ms: number) => Promise<void>; dispose: () => void } {
    let woken = false;
    let resolve: (() => void) | null = null;
    const w = () => {
      woken = true;
      resolve?.();
    };
    const set = this.waiters.get(id) ?? new Set();
    this.waiters.set(id, set);
    set.add(w);
    let timer: NodeJS.Timeout | undefined;
    return {
      wait: (ms) =>
        woken
          ? Promise.resolve()
          : new Promise<void>((r) => {
              resolve = r;
              timer = setTimeout(r, Math.max(1, ms));
            }),
      dispose: () => {
        clearTimeout(timer);
        set.delete(w);
        if (set.size === 0 && this.waiters.get(id) === set) this.waiters.delete(id);
      },
    };
  }

  /**
   * The events of session `sessionId` after `from`, ending with `end` once it has ended. Pulled, like
   * the run stream: nothing is read while the caller is not asking for the next item.
   */
  async *stream(feed: EventFeed, sessionId: string, from: SessionResume, signal: AbortSignal): AsyncGenerator<FeedItem> {
    if ('end' in from) return;
    let cell = Math.max(1, from.cell);
    let after = from.cell >= 1 ? from.id : -1;
    let lastSent = Date.now();
    const aborted = new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener('abort', () => r(), { once: true })));
    while (!signal.aborted && !feed.stopped) {
      const armed = this.arm(sessionId);
      try {
        // The session first: an ended session starts no cell, so a cell missing after it never comes.
        const session = await getSession(this.db.kysely, sessionId);
        if (!session) return;
        const record = await nextCellRecord(this.db.kysely, sessionId, cell);
        if (record) {
          if (record.cell !== cell) after = -1;
          const n = record.cell ?? cell;
          for await (const item of feed.stream(record, after, signal)) {
            if ('ping' in item) yield item;
            else yield cellEvent(item, record.id, n);
            lastSent = Date.now();
          }
          if (signal.aborted || feed.stopped) return;
          cell = n + 1;
          after = -1;
          continue;
        }
        if (session.status === 'ended') {
          yield { id: `${cell - 1}:end`, event: 'end', data: JSON.stringify(sessionView(session)) };
          return;
        }
        await Promise.race([armed.wait(Math.min(this.pollMs, lastSent + this.pingMs - Date.now())), aborted]);
        if (Date.now() - lastSent >= this.pingMs && !signal.aborted) {
          yield { ping: true };
          lastSent = Date.now();
        }
      } finally {
        armed.dispose();
      }
    }
  }
}

/** A run event as a session event: renamed where the cell's start and end are, tagged with the cell. */
function cellEvent(e: { id: string; event: string; data: string }, executionId: string, cell: number): FeedItem {
  const id = `${cell}:${e.id}`;
  const data = JSON.parse(e.data) as Record<string, unknown>;
  if (e.id === '0' && e.event === 'status') return { id, event: 'cell', data: JSON.stringify({ execution_id: executionId, cell, status: data.status, at: data.at }) };
  const event = e.event === 'end' ? 'cell_end' : e.event;
  return { id, event, data: JSON.stringify({ execution_id: executionId, cell, ...data }) };
}
