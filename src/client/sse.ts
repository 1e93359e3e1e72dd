/**
 * Reading one of the service's event streams (`GET /jobs/{id}/events`, `GET /sessions/{id}/events`;
 * docs/api.md) as an async iterator: parsed by eventsource-parser (a maintained SSE parser) rather
 * than the browser's EventSource, which cannot send an Authorization header and is not in Node, and
 * resumed with `Last-Event-ID` when the connection drops before the stream's last event.
 */
import { EventSourceParserStream } from 'eventsource-parser/stream';
import { SandpodError } from './errors.ts';

export interface EventsOptions {
  /** Resume after this event id (`Last-Event-ID`). */
  lastEventId?: string;
  /** Stops the stream (the iterator then throws the abort reason). */
  signal?: AbortSignal;
  /** Reconnections (with `Last-Event-ID`) when the connection drops before `end`; default 5. */
  retries?: number;
  /** First wait before reconnecting, doubled each time; default 500 ms. */
  retryDelayMs?: number;
}

/** What {@link readEventStream} needs of its client. */
export interface StreamSource {
  url: string;
  headers: Record<string, string>;
  /** fetch that throws SandpodConnectionError for an unreachable service. */
  fetch: (url: string, init: RequestInit) => Promise<Response>;
  /** Event names passed on (others are skipped: the server may add some). */
  known: ReadonlySet<string>;
  /** The event after which the server closes the stream. */
  last: string;
  /** What the stream is of, for errors ("job X"). */
  what: string;
}

/** The stream's events, `data` parsed, until `source.last`. */
export async function* readEventStream(source: StreamSource, o: EventsOptions = {}): AsyncGenerator<{ event: string; id: string; data: unknown }, void, undefined> {
  const retries = o.retries ?? 5;
  let delay = o.retryDelayMs ?? 500;
  let lastId = o.lastEventId;
  let failures = 0;
  for (;;) {
    const local = new AbortController();
    const onAbort = () => local.abort(o.signal?.reason);
    o.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      let res: Response;
      try {
        res = await source.fetch(source.url, {
          headers: { ...source.headers, accept: 'text/event-stream', ...(lastId !== undefined ? { 'last-event-id': lastId } : {}) },
          signal: local.signal,
        });
      } catch (err) {
        // Unreachable at first: say so at once; unreachable while resuming: try again below.
        if (isAbort(err) || lastId === undefined || failures >= retries) throw err;
        failures++;
        await sleep(delay, o.signal);
        delay *= 2;
        continue;
      }
      if (!res.ok) throw await SandpodError.from(res);
      const type = res.headers.get('content-type') ?? '';
      if (!type.startsWith('text/event-stream') || !res.body) {
        await res.body?.cancel();
        throw new SandpodError(res.status, null, `expected an event stream from ${source.url}, got '${type || 'no content type'}'`);
      }
      const stream = res.body.pipeThrough(new TextDecoderStream()).pipeThrough(new EventSourceParserStream());
      try {
        for await (const msg of stream) {
          if (msg.id !== undefined) lastId = msg.id;
          const name = msg.event ?? 'message';
          if (!source.known.has(name)) continue;
          failures = 0;
          yield { event: name, id: msg.id ?? '', data: JSON.parse(msg.data) as unknown };
          if (name === source.last) return;
        }
      } catch (err) {
        if (isAbort(err) || err instanceof SyntaxError) throw err;
        // The connection broke mid-stream: resume below.
      }
      if (failures >= retries) throw new SandpodError(0, null, `the event stream of ${source.what} ended before its ${source.last} event`);
      failures++;
      await sleep(delay, o.signal);
      delay *= 2;
    } finally {
      o.signal?.removeEventListener('abort', onAbort);
      local.abort();
    }
  }
}

export function isAbort(err: unknown): boolean {
  return err instanceof Error && (err.name === 'AbortError' || err.name === 'TimeoutError');
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason as Error);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
