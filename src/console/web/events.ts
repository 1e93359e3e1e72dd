/**
 * Follows one run: the event stream `GET /jobs/{id}/events` (docs/api.md; Server-Sent Events),
 * read with fetch rather than EventSource because EventSource cannot send the Authorization header.
 * The stream is parsed by eventsource-parser; a dropped connection is resumed with `Last-Event-ID`
 * (the id of the last event seen) after a growing pause, until the `end` event arrives.
 *
 * A service without the stream (its 404 is for the route, not the job: `GET /jobs/{id}` still answers)
 * is followed by polling `GET /jobs/{id}` instead; output then appears when the run ends.
 */
import { createParser, type EventSourceMessage } from 'eventsource-parser';
import { ApiError, api, apiUrl, authHeaders, isTerminal, parseExact, toApiError, type Artifact, type RunRecord, type Timing } from './api.ts';

export interface StatusEvent {
  status: string;
  phase?: string;
  at?: string;
  timing?: Partial<Timing>;
}

/** How the run is being followed. */
export type FollowMode = 'connecting' | 'stream' | 'reconnecting' | 'polling' | 'ended';

export interface RunHandlers {
  status(e: StatusEvent): void;
  output(stream: 'stdout' | 'stderr', data: string): void;
  truncated(stream: 'stdout' | 'stderr'): void;
  artifact(a: Artifact): void;
  end(record: RunRecord): void;
  mode(m: FollowMode): void;
  error(e: Error): void;
}

const POLL_MS = 1000;
const MAX_BACKOFF_MS = 10_000;

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(t);
      resolve();
    });
  });
}

/** Hands one event to the handlers; returns true for `end`. Unknown events are ignored (contract). */
export function dispatch(ev: Pick<EventSourceMessage, 'event' | 'data'>, h: RunHandlers): boolean {
  let data: unknown;
  try {
    data = parseExact(ev.data);
  } catch {
    return false;
  }
  const obj = (data ?? {}) as Record<string, unknown>;
  switch (ev.event) {
    case 'status':
      if (typeof obj.status === 'string') h.status(obj as unknown as StatusEvent);
      return false;
    case 'stdout':
    case 'stderr':
      if (typeof obj.data === 'string') h.output(ev.event, obj.data);
      return false;
    case 'truncated':
      if (obj.stream === 'stdout' || obj.stream === 'stderr') h.truncated(obj.stream);
      return false;
    case 'artifact':
      if (typeof obj.name === 'string') h.artifact(obj as unknown as Artifact);
      return false;
    case 'end':
      h.end(obj as unknown as RunRecord);
      return true;
    default:
      return false;
  }
}

/** Starts following run `id`; the returned function stops. */
export function followRun(id: string, h: RunHandlers): () => void {
  const ctl = new AbortController();
  void stream(id, h, ctl.signal).catch((err: unknown) => {
    if (!ctl.signal.aborted) h.error(err as Error);
  });
  return () => ctl.abort();
}

async function stream(id: string, h: RunHandlers, signal: AbortSignal): Promise<void> {
  const how = await readEvents(`jobs/${encodeURIComponent(id)}/events`, signal, {
    onEvent: (ev) => dispatch(ev, h),
    mode: (m) => h.mode(m),
    // The job is unknown (then GET /jobs/{id} is a 404 too, and its error is the one shown), or
    // the service has no stream (the job is there): follow by polling.
    onNotFound: async () => void (await api.job(id)),
  });
  if (how === 'not_found') return poll(id, h, signal);
}

/**
 * Reads the event stream at `path` (a job's or a session's) until `onEvent` says its last event came
 * (`ended`), resuming a dropped connection with `Last-Event-ID` after a growing pause. A 404 calls
 * `onNotFound` (which throws when the thing itself is unknown) and answers `not_found`.
 */
export async function readEvents(
  path: string,
  signal: AbortSignal,
  o: { onEvent(ev: EventSourceMessage): boolean; mode(m: FollowMode): void; onNotFound(): Promise<void> },
): Promise<'ended' | 'not_found' | 'aborted'> {
  let lastId: string | undefined;
  let failures = 0;
  o.mode('connecting');
  while (!signal.aborted) {
    let ended = false;
    try {
      const headers = authHeaders({ Accept: 'text/event-stream', ...(lastId ? { 'Last-Event-ID': lastId } : {}) });
      const res = await fetch(apiUrl(path), { headers, signal, cache: 'no-store' });
      if (res.status === 404) {
        await res.body?.cancel();
        await o.onNotFound();
        return 'not_found';
      }
      if (!res.ok || !res.body) {
        const err = await toApiError(res);
        if (res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429) throw err;
        throw Object.assign(err, { retry: true });
      }
      o.mode('stream');
      failures = 0;
      const parser = createParser({
        onEvent(ev) {
          if (ev.id !== undefined) lastId = ev.id;
          if (o.onEvent(ev)) ended = true;
        },
      });
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        parser.feed(value);
        if (ended) {
          await reader.cancel().catch(() => undefined);
          break;
        }
      }
    } catch (err) {
      if (signal.aborted) return 'aborted';
      if (err instanceof ApiError && !(err as ApiError & { retry?: boolean }).retry) throw err;
      // A network error or a 5xx: resume below.
    }
    if (ended) {
      o.mode('ended');
      return 'ended';
    }
    o.mode('reconnecting');
    failures++;
    await sleep(Math.min(500 * 2 ** failures, MAX_BACKOFF_MS), signal);
  }
  return 'aborted';
}

async function poll(id: string, h: RunHandlers, signal: AbortSignal): Promise<void> {
  h.mode('polling');
  let last = '';
  let failures = 0;
  while (!signal.aborted) {
    try {
      const job = await api.job(id);
      failures = 0;
      if (isTerminal(job.status)) {
        // The final status comes with the record, so status and output change together.
        h.end(await api.record(id));
        h.mode('ended');
        return;
      }
      if (job.status !== last) {
        last = job.status;
        h.status({ status: job.status });
      }
    } catch (err) {
      if (err instanceof ApiError && err.status < 500) throw err;
      failures++;
    }
    await sleep(failures ? Math.min(POLL_MS * 2 ** failures, MAX_BACKOFF_MS) : POLL_MS, signal);
  }
}
