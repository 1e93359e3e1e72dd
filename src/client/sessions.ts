/**
 * The client's session methods (issue 19; docs/api.md "Sessions"): `client.sessions.create()`,
 * `.execute(id, {code})`, `.events(id)` (the session's event stream: each cell live, then `end`), the
 * files of its `/workspace` (`putFile`, `getFile`, `listFiles`, `deleteFile`), `get`, `list`, `close`.
 * Each returns the service's answer or throws `SandpodError` with its error body.
 *
 * ```ts
 * const s = await sandpod.sessions.create({ idle_timeout: 600 });
 * await sandpod.sessions.putFile(s.session_id, 'data.csv', csvBytes);
 * const cell = await sandpod.sessions.execute(s.session_id, { code: 'import pandas as pd\ndf = pd.read_csv("data.csv")' });
 * ```
 */
import type { Client } from 'openapi-fetch';
import { SandpodError, unwrap } from './errors.ts';
import type { components, paths } from './schema.ts';
import { readEventStream, type EventsOptions } from './sse.ts';

type Schemas = components['schemas'];
export type Session = Schemas['Session'];
/** `POST /sessions/{id}/execute`'s answer: `POST /execute`'s, plus `session_id` and `cell`. */
export type CellResult = Schemas['CellResult'];
export type SessionRequest = Schemas['SessionRequest'];
export type SessionPage = { items: Session[]; limit: number; offset: number; has_more: boolean; count: number };
/** A file of the session's `/workspace`. */
export interface SessionFile {
  name: string;
  size_bytes: number;
  modified_at: string;
}
/** What a cell's body takes. */
export interface CellRequest {
  code: string;
  input_data?: Record<string, unknown>;
  timeout?: number;
  callback_url?: string | null;
}

/** Which cell an event is of. */
interface CellTag {
  execution_id: string;
  cell: number;
}

/** One event of `GET /sessions/{id}/events`; events of other names are skipped. */
export type SessionEvent =
  | { event: 'cell'; id: string; data: CellTag & { status: string; at: string } }
  | { event: 'status'; id: string; data: CellTag & { status: string; phase: string; at: string; timing?: Record<string, unknown> } }
  | { event: 'stdout' | 'stderr'; id: string; data: CellTag & { data: string } }
  | { event: 'truncated'; id: string; data: CellTag & { stream: 'stdout' | 'stderr' } }
  | { event: 'artifact'; id: string; data: CellTag & Schemas['Artifact'] }
  | { event: 'cell_end'; id: string; data: Schemas['ExecutionRecordFull'] & { cell: number } }
  | { event: 'end'; id: string; data: Session };

const KNOWN: ReadonlySet<string> = new Set(['cell', 'status', 'stdout', 'stderr', 'truncated', 'artifact', 'cell_end', 'end']);

/** `client.sessions`. */
export interface SessionsApi {
  create(body?: SessionRequest): Promise<Session>;
  get(id: string): Promise<Session>;
  /** A page of sessions, newest first. */
  list(query?: { status?: Session['status']; limit?: number; offset?: number }): Promise<SessionPage>;
  /** Ends the session (`closed`); an ended one comes back as it is. */
  close(id: string): Promise<Session>;
  /** Runs one cell; a failing cell is an answer (`success: false`), not an error. */
  execute(id: string, body: CellRequest): Promise<CellResult>;
  /** The session's cells live, then `end` once it has ended. */
  events(id: string, options?: EventsOptions): AsyncGenerator<SessionEvent, void, undefined>;
  /** Writes a file of `/workspace` (created or replaced). */
  putFile(id: string, name: string, bytes: Uint8Array | string): Promise<{ name: string; size_bytes: number; sha256: string; created: boolean }>;
  getFile(id: string, name: string): Promise<Uint8Array>;
  listFiles(id: string): Promise<SessionFile[]>;
  deleteFile(id: string, name: string): Promise<void>;
}

/** The session methods over the client's openapi-fetch and fetch. */
export function sessionsApi(c: { baseUrl: string; headers: Record<string, string>; fetch: (url: string, init: RequestInit) => Promise<Response>; api: Client<paths> }): SessionsApi {
  const { api } = c;
  const path = (id: string) => ({ params: { path: { id } } });
  const fileUrl = (id: string, name: string) => `${c.baseUrl}/sessions/${encodeURIComponent(id)}/files/${encodeURIComponent(name)}`;
  const call = async (url: string, init: RequestInit): Promise<Response> => {
    const res = await c.fetch(url, { ...init, headers: { ...c.headers, ...(init.headers as Record<string, string>) } });
    if (!res.ok) throw await SandpodError.from(res);
    return res;
  };
  return {
    create: async (body = {}) => unwrap(await api.POST('/sessions', { body })),
    get: async (id) => unwrap(await api.GET('/sessions/{id}', path(id))),
    list: async (query = {}) => unwrap(await api.GET('/sessions', { params: { query } })) as SessionPage,
    close: async (id) => unwrap(await api.DELETE('/sessions/{id}', path(id))),
    execute: async (id, body) => unwrap(await api.POST('/sessions/{id}/execute', { ...path(id), body: body as never })),
    events: (id, o = {}) =>
      readEventStream({ url: `${c.baseUrl}/sessions/${encodeURIComponent(id)}/events`, headers: c.headers, fetch: c.fetch, known: KNOWN, last: 'end', what: `session ${id}` }, o) as AsyncGenerator<
        SessionEvent,
        void,
        undefined
      >,
    async putFile(id, name, bytes) {
      const res = await call(fileUrl(id, name), { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: typeof bytes === 'string' ? bytes : new Uint8Array(bytes) });
      return { ...((await res.json()) as { name: string; size_bytes: number; sha256: string }), created: res.status === 201 };
    },
    async getFile(id, name) {
      return new Uint8Array(await (await call(fileUrl(id, name), { method: 'GET' })).arrayBuffer());
    },
    async listFiles(id) {
      return ((await (await call(`${c.baseUrl}/sessions/${encodeURIComponent(id)}/files`, { method: 'GET' })).json()) as { items: SessionFile[] }).items;
    },
    async deleteFile(id, name) {
      await call(fileUrl(id, name), { method: 'DELETE' });
    },
  };
}
