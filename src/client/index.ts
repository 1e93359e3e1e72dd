/**
 * The typed sandpod client: openapi-fetch over the types generated from the service's own OpenAPI
 * document (`schema.ts`, `npm run gen:client`), a bearer token when given, one error type for error
 * bodies and one for an unreachable service, and `events(jobId)`: the job's event stream
 * (`GET /jobs/{id}/events`, docs/api.md) as an async iterator of typed events.
 *
 * ```ts
 * import { createSandpodClient, unwrap } from 'sandpod';
 * const sandpod = createSandpodClient({ baseUrl: 'http://127.0.0.1:8000', token: process.env.SANDPOD_TOKEN });
 * const job = unwrap(await sandpod.POST('/execute/async', { body: { code: 'print(1)' } }));
 * for await (const ev of sandpod.events(job.job_id)) if (ev.event === 'stdout') process.stdout.write(ev.data.data);
 * ```
 *
 * The stream is parsed by eventsource-parser (a maintained SSE parser) rather than the browser's
 * EventSource, which cannot send an Authorization header and is not in Node.
 */
import createClient, { type Client } from 'openapi-fetch';
import { EventSourceParserStream } from 'eventsource-parser/stream';
import type { components, operations, paths } from './schema.ts';

export type { components, operations, paths };

type Schemas = components['schemas'];
/** A record with every field (`view=full`). */
export type ExecutionRecordFull = Schemas['ExecutionRecordFull'];
/** A record's summary fields (the default view). */
export type ExecutionRecord = Schemas['ExecutionRecord'];
export type Artifact = Schemas['Artifact'];
export type JobType = Schemas['JobType'];
export type JobTypeBuild = Schemas['JobTypeBuild'];
export type Submission = Schemas['Submission'];
/** The one error body of every error answer. */
export type ErrorBody = Schemas['Error'];
/** A record's status. */
export type RecordStatus = ExecutionRecordFull['status'];

/** `status` event: a status or phase change. */
export interface StatusEventData {
  status: RecordStatus | (string & {});
  /** `queued`, `starting` (the sandbox), `installing` (requirements), `running` (the program), … */
  phase: string;
  at: string;
  timing?: Record<string, unknown>;
}

/** One event of `GET /jobs/{id}/events`; events of other names are skipped (the server may add some). */
export type SandpodEvent =
  | { event: 'status'; id: string; data: StatusEventData }
  | { event: 'stdout' | 'stderr'; id: string; data: { data: string } }
  | { event: 'truncated'; id: string; data: { stream: 'stdout' | 'stderr' } }
  | { event: 'artifact'; id: string; data: Artifact }
  | { event: 'end'; id: string; data: ExecutionRecordFull };

const KNOWN_EVENTS: ReadonlySet<string> = new Set(['status', 'stdout', 'stderr', 'truncated', 'artifact', 'end']);

/** The service answered with an error (`detail`, `code` from the error body, or the HTTP status). */
export class SandpodError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly correlationId: string | null;
  /** The whole error body (it may add facts such as `existing_job_id`, `job_id`, `build`). */
  readonly body: Record<string, unknown> | null;

  constructor(status: number, body: unknown, fallback?: string) {
    const b = body !== null && typeof body === 'object' && !Array.isArray(body) ? (body as Record<string, unknown>) : null;
    const detail = typeof b?.detail === 'string' ? b.detail : (fallback ?? `HTTP ${status}`);
    const code = typeof b?.code === 'string' ? b.code : `http_${status}`;
    super(`${detail} [${code}]`);
    this.name = 'SandpodError';
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.correlationId = typeof b?.correlation_id === 'string' ? b.correlation_id : null;
    this.body = b;
  }

  /** From a response whose body was not read yet. */
  static async from(res: Response): Promise<SandpodError> {
    const text = await res.text().catch(() => '');
    let body: unknown = null;
    try {
      body = JSON.parse(text);
    } catch {
      // Not the service's error body (a proxy's page, say): say what came back.
    }
    const snippet = text.replace(/\s+/g, ' ').trim().slice(0, 120);
    return new SandpodError(res.status, body, `HTTP ${res.status} ${res.statusText}${snippet ? `: ${snippet}` : ''}`.trim());
  }
}

/** The service could not be reached (connection refused, DNS, TLS, reset). */
export class SandpodConnectionError extends Error {
  readonly baseUrl: string;
  constructor(baseUrl: string, cause: unknown) {
    super(`cannot reach the service at ${baseUrl}: ${describeCause(cause)}`, { cause });
    this.name = 'SandpodConnectionError';
    this.baseUrl = baseUrl;
  }
}

/** The innermost reason of a fetch failure (`connect ECONNREFUSED 127.0.0.1:8000`, …). */
function describeCause(err: unknown): string {
  let e: unknown = err;
  for (let i = 0; i < 5 && e instanceof Error && e.cause !== undefined; i++) e = e.cause;
  if (e instanceof AggregateError && e.errors.length > 0) e = e.errors[0];
  return e instanceof Error ? e.message : String(e);
}

/**
 * The data of an openapi-fetch answer, or a `SandpodError` thrown with the error body.
 * `unwrap(await client.GET('/jobs/{id}', { params: { path: { id } } }))`.
 */
export function unwrap<T>(result: { data?: T; error?: unknown; response: Response }): T {
  if (result.error !== undefined || !result.response.ok) {
    throw new SandpodError(result.response.status, result.error, `HTTP ${result.response.status} ${result.response.statusText}`);
  }
  return result.data as T;
}

export interface SandpodClientOptions {
  /** Where the service is, e.g. `http://127.0.0.1:8000` (a path prefix is kept). */
  baseUrl: string;
  /** An API token: sent as `Authorization: Bearer <token>`. */
  token?: string | undefined;
  /** Other headers for every request. */
  headers?: Record<string, string>;
  /** A fetch implementation (the global one by default). */
  fetch?: typeof globalThis.fetch;
}

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

/** The typed client: openapi-fetch's `GET`/`POST`/… plus `events`. */
export type SandpodClient = Client<paths> & {
  readonly baseUrl: string;
  /** The job's event stream; ends after the `end` event. Throws `SandpodError` for an error answer (404: unknown job). */
  events(jobId: string, options?: EventsOptions): AsyncGenerator<SandpodEvent, void, undefined>;
};

/** A client for the service at `baseUrl`. */
export function createSandpodClient(options: SandpodClientOptions): SandpodClient {
  const baseUrl = options.baseUrl.replace(/\/+$/, '');
  const rawFetch = options.fetch ?? globalThis.fetch;
  const headers: Record<string, string> = { ...options.headers, ...(options.token ? { authorization: `Bearer ${options.token}` } : {}) };
  const fetchOrExplain = async (input: Request | string, init?: RequestInit): Promise<Response> => {
    try {
      return await rawFetch(input, init);
    } catch (err) {
      if (isAbort(err)) throw err;
      throw new SandpodConnectionError(baseUrl, err);
    }
  };
  const api = createClient<paths>({ baseUrl, headers, fetch: (req: Request) => fetchOrExplain(req) });

  async function* events(jobId: string, o: EventsOptions = {}): AsyncGenerator<SandpodEvent, void, undefined> {
    const url = `${baseUrl}/jobs/${encodeURIComponent(jobId)}/events`;
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
          res = await fetchOrExplain(url, {
            headers: { ...headers, accept: 'text/event-stream', ...(lastId !== undefined ? { 'last-event-id': lastId } : {}) },
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
          throw new SandpodError(res.status, null, `expected an event stream from ${url}, got '${type || 'no content type'}'`);
        }
        const stream = res.body.pipeThrough(new TextDecoderStream()).pipeThrough(new EventSourceParserStream());
        try {
          for await (const msg of stream) {
            if (msg.id !== undefined) lastId = msg.id;
            const name = msg.event ?? 'message';
            if (!KNOWN_EVENTS.has(name)) continue;
            failures = 0;
            const ev = { event: name, id: msg.id ?? '', data: JSON.parse(msg.data) as unknown } as SandpodEvent;
            yield ev;
            if (ev.event === 'end') return;
          }
        } catch (err) {
          if (isAbort(err) || err instanceof SyntaxError) throw err;
          // The connection broke mid-stream: resume below.
        }
        if (failures >= retries) throw new SandpodError(0, null, `the event stream of job ${jobId} ended before its end event`);
        failures++;
        await sleep(delay, o.signal);
        delay *= 2;
      } finally {
        o.signal?.removeEventListener('abort', onAbort);
        local.abort();
      }
    }
  }

  return Object.assign(api, { baseUrl, events });
}

function isAbort(err: unknown): boolean {
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
