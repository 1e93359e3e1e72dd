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
import { SandpodConnectionError } from './errors.ts';
import type { components, operations, paths } from './schema.ts';
import { sessionsApi, type SessionsApi } from './sessions.ts';
import { isAbort, readEventStream, type EventsOptions } from './sse.ts';

export type { components, operations, paths };
export { SandpodConnectionError, SandpodError, unwrap } from './errors.ts';
export type { EventsOptions } from './sse.ts';
export type { CellRequest, CellResult, Session, SessionEvent, SessionFile, SessionPage, SessionRequest, SessionsApi } from './sessions.ts';

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

/** The typed client: openapi-fetch's `GET`/`POST`/… plus `events`. */
export type SandpodClient = Client<paths> & {
  readonly baseUrl: string;
  /** The job's event stream; ends after the `end` event. Throws `SandpodError` for an error answer (404: unknown job). */
  events(jobId: string, options?: EventsOptions): AsyncGenerator<SandpodEvent, void, undefined>;
  /** Sessions (issue 19): create, execute cells, their event stream, files, get, list, close. */
  readonly sessions: SessionsApi;
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

  const events = (jobId: string, o: EventsOptions = {}) =>
    readEventStream(
      { url: `${baseUrl}/jobs/${encodeURIComponent(jobId)}/events`, headers, fetch: fetchOrExplain, known: KNOWN_EVENTS, last: 'end', what: `job ${jobId}` },
      o,
    ) as AsyncGenerator<SandpodEvent, void, undefined>;
  const sessions = sessionsApi({ baseUrl, headers, fetch: fetchOrExplain, api });

  return Object.assign(api, { baseUrl, events, sessions });
}
