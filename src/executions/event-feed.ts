/**
 * Reading run events for clients (`GET /jobs/{id}/events`; the writer and the id scheme are in
 * events.ts), in any replica.
 *
 * One reader per watched run and process, fanned out in memory (issue 22 item 8): 500 streams on one
 * run used to be 500 loops each querying the table on every notification and every poll; now one
 * {@link RunReader} queries, and its subscribers take the events from its buffer. The reader reads
 * the next page only when a subscriber is waiting for it (caught up), so it runs at the pace of the
 * fastest client and never further than a page ahead of it. A subscriber that falls behind the buffer
 * (a slow client, or one resuming from an old `Last-Event-ID`) reads its own pages from the table until
 * it reaches the buffer again, one page at a time as its client takes them: a slow client costs its
 * own reads, never memory, and never holds the others back.
 *
 * The record stays the truth: when it is terminal the reader makes the closing events from it once
 * (`status` finished, `artifact`s, `end`; ids after the largest stored id, so every read gives the same
 * ids), and a run that stored no output gets its output from the record.
 */
import type { Db, ExecutionRow } from '../store/database.ts';
import { DONE_CHANNEL } from '../queue/channels.ts';
import { listArtifacts } from '../store/artifacts.repository.ts';
import { eventsAfter, eventsSummary, type StoredRunEvent } from '../store/events.repository.ts';
import { getExecution } from '../store/executions.repository.ts';
import { stringifyJson } from '../util/json.ts';
import { CHUNK_CHARS, EVENTS_CHANNEL, PING_MS } from './events.ts';
import { isTerminal } from './status.ts';
import { recordView } from './views.ts';

/** One thing to send: an event, or a keep-alive comment. */
export type FeedItem = { id: string; event: string; data: string } | { ping: true };
type FeedEvent = { id: string; event: string; data: string };

/** Events read from the table per query (each at most {@link CHUNK_CHARS} of output). */
const PAGE = 32;
/** Events a reader keeps for its subscribers: about 1 MB at most (64 × 16 K characters). */
const BUFFER = 64;
/** Readers re-check the table this often even without a notification (a lost NOTIFY costs this much). */
const POLL_MS = 2_000;

const iso = (ms: number | Date | string) => new Date(ms).toISOString();

/** A promise that the next {@link Signal.fire} resolves. */
class Signal {
  private resolve!: () => void;
  private promise = this.reset();
  private reset(): Promise<void> {
    return (this.promise = new Promise((r) => (this.resolve = r)));
  }
  wait(): Promise<void> {
    return this.promise;
  }
  fire(): void {
    this.resolve();
    this.reset();
  }
}

/** Waits for `p`, at most `ms`. */
async function within(p: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p, new Promise<void>((r) => (timer = setTimeout(r, Math.max(1, ms))))]);
  clearTimeout(timer);
}

/** The one reader of a run in this process, shared by every stream watching it. */
class RunReader {
  /** Every stored event with an id in (coveredFrom, head], in order. */
  readonly buffer: StoredRunEvent[] = [];
  coveredFrom: number;
  head: number;
  /** The closing events, once the record is terminal and every stored event was read. */
  tail: FeedEvent[] | null = null;
  gone = false;
  error: unknown = null;
  subscribers = 0;
  /** Subscribers caught up and waiting for more: the reader reads only for them. */
  waiting = 0;
  /** Fired when the buffer grows or the reader ends. */
  readonly data = new Signal();
  /** Fired on a notification, on a subscriber leaving and on stop. */
  readonly kick = new Signal();
  /** Fired when a subscriber starts waiting while none was (the reader may be parked for lack of one). */
  readonly demand = new Signal();
  private woken = false;

  constructor(
    private readonly feed: EventFeed,
    readonly row: ExecutionRow,
    from: number,
  ) {
    this.coveredFrom = from;
    this.head = from;
  }

  get ended(): boolean {
    return this.tail !== null || this.gone || this.error !== null;
  }

  /** A notification for this run (events stored, or the run ended). */
  wake(): void {
    this.woken = true;
    this.kick.fire();
  }

  /** Buffered events after `id`, or null when the buffer does not reach back to it. */
  after(id: number): StoredRunEvent[] | null {
    if (id < this.coveredFrom) return null;
    let i = this.buffer.length;
    while (i > 0 && this.buffer[i - 1]!.id > id) i--;
    return this.buffer.slice(i);
  }

  /** Reads while anyone watches; ends at the record's end, its disappearance or an error. */
  async run(): Promise<void> {
    const { db } = this.feed;
    const id = this.row.id;
    try {
      while (this.subscribers > 0 && !this.feed.stopped) {
        if (this.waiting === 0) {
          // Nobody is caught up: reading on would only fill the buffer ahead of every client.
          await Promise.race([this.demand.wait(), this.kick.wait()]);
          continue;
        }
        // Cleared before reading: a notification during the read makes the next pass read again.
        this.woken = false;
        this.feed.queries++;
        const page = await eventsAfter(db.kysely, id, this.head, PAGE);
        if (page.length > 0) this.append(page);
        if (page.length === PAGE) continue;
        this.feed.queries++;
        const now = await getExecution(db.kysely, id);
        if (!now) {
          this.gone = true;
          return;
        }
        if (isTerminal(now.status)) {
          // Output is stored before the record is settled: what the read above missed is there now.
          if ((await eventsAfter(db.kysely, id, this.head, 1)).length > 0) continue;
          this.tail = await closingEvents(db, now);
          return;
        }
        if (!this.woken) await within(this.kick.wait(), this.feed.pollMs);
      }
    } catch (err) {
      this.error = err;
    } finally {
      this.feed.release(this);
      this.data.fire();
    }
  }

  private append(page: StoredRunEvent[]): void {
    for (const e of page) {
      this.feed.dataBytesRead += e.data.length;
      this.buffer.push(e);
    }
    this.head = page[page.length - 1]!.id;
    const drop = this.buffer.length - BUFFER;
    if (drop > 0) this.coveredFrom = this.buffer.splice(0, drop)[drop - 1]!.id;
    this.data.fire();
  }
}

/**
 * Run events for clients: one LISTEN per channel per process, one {@link RunReader} per watched run,
 * fanned out to its streams.
 */
export class EventFeed {
  private readonly readers = new Map<string, RunReader>();
  private unlisten: (() => Promise<void>)[] = [];
  /** Bytes of event data read from the store so far (tests, diagnostics). */
  dataBytesRead = 0;
  /** Table queries made for streams so far: by shared readers and by subscribers catching up. */
  queries = 0;
  /** Of {@link queries}, those of subscribers behind the shared buffer. */
  catchUpQueries = 0;
  stopped = false;
  readonly pollMs: number;
  private readonly pingMs: number;

  constructor(
    readonly db: Db,
    opts: { pingMs?: number; pollMs?: number } = {},
  ) {
    this.pingMs = opts.pingMs ?? PING_MS;
    this.pollMs = opts.pollMs ?? POLL_MS;
  }

  async start(): Promise<void> {
    const wake = (id: string) => this.readers.get(id)?.wake();
    this.unlisten.push(await this.db.listen(EVENTS_CHANNEL, wake), await this.db.listen(DONE_CHANNEL, wake));
  }

  /**
   * Ends every open stream (shutdown): their clients reconnect with `Last-Event-ID`, to another replica
   * or to this one once it is back, and miss nothing.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const u of this.unlisten.splice(0)) await u().catch(() => {});
    for (const r of this.readers.values()) {
      r.kick.fire();
      r.demand.fire();
      r.data.fire();
    }
  }

  /** Runs with a reader in this process (tests, diagnostics). */
  get watchedRuns(): number {
    return this.readers.size;
  }

  /** Forgets a reader that ended, so the next stream of its run starts a fresh one. */
  release(r: RunReader): void {
    if (this.readers.get(r.row.id) === r && (r.subscribers === 0 || r.error !== null)) this.readers.delete(r.row.id);
  }

  /**
   * The events of run `row` after `afterId` (-1: from the start), ending with `end` once the record is
   * terminal. Pulled: nothing is read for this stream while its caller is not asking for the next item.
   */
  async *stream(row: ExecutionRow, afterId: number, signal?: AbortSignal): AsyncGenerator<FeedItem> {
    let last = afterId;
    if (last < 0) {
      yield { id: '0', event: 'status', data: JSON.stringify(creationStatus(row)) };
      last = 0;
    }
    let reader = this.readers.get(row.id);
    if (!reader) {
      reader = new RunReader(this, row, last);
      this.readers.set(row.id, reader);
      reader.subscribers++;
      void reader.run();
    } else reader.subscribers++;
    const r = reader;
    const aborted = new Promise<void>((resolve) => {
      if (signal?.aborted) resolve();
      signal?.addEventListener('abort', () => resolve(), { once: true });
    });
    let lastSent = Date.now();
    try {
      while (!signal?.aborted && !this.stopped) {
        const buffered = r.after(last);
        if (buffered === null) {
          // Behind the shared buffer: this stream's own page, then try the buffer again.
          const headBefore = r.head;
          this.queries++;
          this.catchUpQueries++;
          const page = await eventsAfter(this.db.kysely, row.id, last, PAGE);
          for (const e of page) {
            this.dataBytesRead += e.data.length;
            yield { id: String(e.id), event: e.kind, data: e.data };
            last = e.id;
            lastSent = Date.now();
          }
          // A short page is everything stored after `last`, so up to the reader's head as it was.
          if (page.length < PAGE) last = Math.max(last, headBefore);
          continue;
        }
        if (buffered.length > 0) {
          for (const e of buffered) {
            yield { id: String(e.id), event: e.kind, data: e.data };
            last = e.id;
          }
          lastSent = Date.now();
          continue;
        }
        if (last >= r.head && r.ended) {
          if (r.error !== null) throw r.error;
          if (r.tail) for (const e of r.tail) if (Number(e.id) > last) yield e;
          return;
        }
        const more = r.data.wait();
        if (++r.waiting === 1) r.demand.fire();
        try {
          await within(Promise.race([more, aborted]), lastSent + this.pingMs - Date.now());
        } finally {
          r.waiting--;
        }
        if (Date.now() - lastSent >= this.pingMs && r.after(last)?.length === 0 && !r.ended) {
          yield { ping: true };
          lastSent = Date.now();
        }
      }
    } finally {
      r.subscribers--;
      if (r.subscribers === 0) {
        this.release(r);
        r.kick.fire();
        r.demand.fire();
      }
    }
  }
}

/** The terminal events, made from the record; ids after the run's largest stored id. */
async function closingEvents(db: Db, row: ExecutionRow): Promise<FeedEvent[]> {
  const { maxId, hasOutput } = await eventsSummary(db.kysely, row.id);
  const arts = await listArtifacts(db.kysely, row.id);
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

/** Event 0: the record as it was created (async: queued; sync: starting at once). */
function creationStatus(row: ExecutionRow): Record<string, unknown> {
  const sync = row.mode === 'sync';
  return { status: sync ? 'running' : 'queued', phase: sync ? 'starting' : 'queued', at: iso(row.created_at), timing: {} };
}
