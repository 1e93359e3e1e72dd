/**
 * The console's calls to the service: small typed wrappers over fetch, one per endpoint it uses
 * (docs/api.md). The shapes here are the subset the pages read; the typed client generated from
 * /openapi.json (src/client) can replace them without touching the pages.
 *
 * Every URL is relative to the page (`/ui` → `/`), so the console works behind a path prefix.
 * With authentication on, the bearer token the user typed is kept in sessionStorage (this tab only,
 * gone when it closes) and sent as `Authorization` on every call; a 401 asks for it again.
 */

import { LosslessNumber, parse as parseLossless, stringify as stringifyLossless } from 'lossless-json';
import type { components } from '../../client/schema.ts';

export type RecordStatus = 'queued' | 'running' | 'succeeded' | 'failed' | 'timeout' | 'oom' | 'cancelled';
export const RECORD_STATUSES: readonly RecordStatus[] = ['queued', 'running', 'succeeded', 'failed', 'timeout', 'oom', 'cancelled'];
export const isTerminal = (s: string): boolean => s !== 'queued' && s !== 'running' && s !== 'pending';

// The service's own shapes, from the OpenAPI document (src/client/schema.ts, generated: npm run
// gen:client), so the console cannot drift from the API it calls.
type Schemas = components['schemas'];
export type RunError = Schemas['RunError'];
export type Timing = Schemas['Timing'];
export type Artifact = Schemas['Artifact'];
/** A record: the brief view, with the full view's fields when it was asked for (`view=full`). */
export type RunRecord = Schemas['ExecutionRecord'] & Partial<Omit<Schemas['ExecutionRecordFull'], keyof Schemas['ExecutionRecord']>>;
export type JobStatus = Schemas['JobStatus'];
/** A page of any list (SPEC §2.8): the paging fields of the API's own pages, with `items` of T. */
export type Page<T> = Omit<Schemas['ExecutionsPage'], 'items'> & { items: T[] };
export type JobType = Schemas['JobType'];
export type Submission = Schemas['Submission'];
export interface SubmitRequest {
  code: string;
  /** The input as the user wrote it (JSON object text), sent verbatim so its numbers keep their digits. */
  input_json?: string;
  job_type?: string;
  requirements?: string[];
  timeout?: number;
}
export type DlqEntry = Schemas['DlqEntry'];
export type DlqStats = Schemas['DlqStats'];
export type Health = Schemas['Health'];
export type HealthStatus = Schemas['HealthStatus'];
export type PoolStats = Schemas['PoolStats'];
export type Session = Schemas['Session'];
export type CellResult = Schemas['CellResult'];

/** An answer that was not a success: the service's error body when it sent one. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    detail: string,
  ) {
    super(detail);
  }
}

const TOKEN_KEY = 'sandpod.token';

/** The token this tab uses, if any. */
export function getToken(): string | null {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/** Keeps (or with null forgets) the token for this tab. */
export function setToken(token: string | null): void {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  for (const l of authListeners) l('token');
}

/** What changed: the token itself, or whether the service wants one. */
export type AuthChange = 'token' | 'required';
const authListeners = new Set<(what: AuthChange) => void>();
let authRequired = false;

/** Whether the service has answered 401 since the token last changed. */
export const needsToken = (): boolean => authRequired;

/** Calls `l` when a call was refused for want of a (valid) token, or the token changed. */
export function onAuthChange(l: (what: AuthChange) => void): () => void {
  authListeners.add(l);
  return () => authListeners.delete(l);
}

/** The absolute URL of an API path (given without a leading slash), relative to the page. */
export function apiUrl(path: string, query?: Record<string, string | number | undefined>): string {
  const url = new URL(path.replace(/^\//, ''), document.baseURI);
  for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined && v !== '') url.searchParams.set(k, String(v));
  return url.href;
}

/** Headers for a call: the token when one is set. */
export function authHeaders(extra: Record<string, string> = {}): Record<string, string> {
  const token = getToken();
  return token ? { ...extra, Authorization: `Bearer ${token}` } : extra;
}

/** Reads an error answer into an ApiError (and notes a 401). */
export async function toApiError(res: Response): Promise<ApiError> {
  let code = 'http_error';
  let detail = `${res.status} ${res.statusText}`;
  try {
    const body = (await res.json()) as { code?: unknown; detail?: unknown };
    if (typeof body.code === 'string') code = body.code;
    if (typeof body.detail === 'string') detail = body.detail;
  } catch {
    // not JSON: keep the status line
  }
  if (res.status === 401 && !authRequired) {
    authRequired = true;
    for (const l of authListeners) l('required');
  }
  return new ApiError(res.status, code, detail);
}

/**
 * One call. `accept` lists statuses whose JSON body is an answer rather than an error (503 for a
 * degraded /health, which still carries the health body).
 */
export async function call<T>(method: string, path: string, opts: { query?: Record<string, string | number | undefined>; body?: unknown; accept?: number[]; signal?: AbortSignal; exact?: boolean } = {}): Promise<T> {
  const init: RequestInit = { method, headers: authHeaders(opts.body === undefined ? {} : { 'Content-Type': 'application/json' }) };
  if (opts.body !== undefined) init.body = opts.body instanceof RawJson ? opts.body.text : JSON.stringify(opts.body);
  if (opts.signal) init.signal = opts.signal;
  const res = await fetch(apiUrl(path, opts.query), init);
  if (!res.ok && !(opts.accept ?? []).includes(res.status)) throw await toApiError(res);
  if (authRequired) {
    authRequired = false;
    for (const l of authListeners) l('required');
  }
  return (opts.exact ? parseExact(await res.text()) : await res.json()) as T;
}

/**
 * Parses JSON keeping every number's text: small integers become numbers (counts, sizes, times),
 * any other number a LosslessNumber, so `12345678901234567890` or `1.0` in a run's input or output is
 * shown as it was written (docs/api.md, "What is kept exactly"), not as JavaScript rounds it.
 */
export function parseExact(text: string): unknown {
  return parseLossless(text, null, (s) => (/^-?\d{1,15}$/.test(s) ? Number(s) : new LosslessNumber(s)));
}

/** Shows a JSON value (parsed by parseExact) with its numbers as they were written. */
export function showJson(value: unknown): string {
  return stringifyLossless(value, null, 2) ?? 'undefined';
}

const enc = encodeURIComponent;

/** A request body already written as JSON text. */
class RawJson {
  constructor(readonly text: string) {}
}

/** The body of a submission: the input's text goes in as it is (checked to be a JSON object first). */
export function submissionBody(req: SubmitRequest): string {
  const { input_json, ...rest } = req;
  const fields = JSON.stringify(rest).slice(1, -1);
  const input = input_json?.trim();
  if (!input) return `{${fields}}`;
  const parsed = parseExact(input);
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('the input must be a JSON object, like {"name": "world"}');
  return `{${fields},"input_data":${input}}`;
}

export const api = {
  executions: (q: { status?: string; job_type?: string; limit?: number; offset?: number }, signal?: AbortSignal) =>
    call<Page<RunRecord>>('GET', 'executions', { query: q, ...(signal ? { signal } : {}) }),
  job: (id: string) => call<JobStatus>('GET', `jobs/${enc(id)}`),
  record: (id: string) => call<RunRecord>('GET', `executions/${enc(id)}`, { query: { view: 'full' }, exact: true }),
  submit: (req: SubmitRequest) => call<Submission>('POST', 'execute/async', { body: new RawJson(submissionBody(req)) }),
  cancel: (id: string) => call<{ status: string; message: string }>('POST', `jobs/${enc(id)}/cancel`, { accept: [202] }),
  rerun: (id: string) => call<{ job_id: string }>('POST', `jobs/${enc(id)}/rerun`),
  jobTypes: () => call<JobType[]>('GET', 'job-types'),
  dlq: (q: { error_type?: string; limit?: number; offset?: number }) => call<Page<DlqEntry>>('GET', 'dlq', { query: q }),
  dlqStats: () => call<DlqStats>('GET', 'dlq/stats'),
  dlqDelete: (id: number) => call<{ id: number; deleted: true }>('DELETE', `dlq/${id}`),
  health: () => call<Health | HealthStatus>('GET', 'health', { accept: [503] }),
  pool: () => call<PoolStats>('GET', 'pool/stats'),
  sessions: (q: { status?: string; limit?: number; offset?: number }) => call<Page<Session>>('GET', 'sessions', { query: q }),
  session: (id: string) => call<Session>('GET', `sessions/${enc(id)}`),
  createSession: (body: { job_type?: string }) => call<Session>('POST', 'sessions', { body }),
  closeSession: (id: string) => call<Session>('DELETE', `sessions/${enc(id)}`),
  /** Runs a cell; its answer comes when it ends (the session's event stream shows it live). */
  execute: (id: string, code: string) => call<CellResult>('POST', `sessions/${enc(id)}/execute`, { body: { code }, accept: [503] }),
  artifactUrl: (id: string, name: string) => apiUrl(`jobs/${enc(id)}/artifacts/${enc(name)}`),
  /** An artifact's text (for the submitted code and input). */
  async artifactText(id: string, name: string): Promise<string> {
    const res = await fetch(api.artifactUrl(id, name), { headers: authHeaders() });
    if (!res.ok) throw await toApiError(res);
    return res.text();
  },
};

/**
 * Saves an artifact as a file. Without a token a plain link does it (the browser streams the file);
 * with one, a link cannot carry the header, so the bytes are fetched and handed over as a blob.
 */
export async function downloadArtifact(id: string, name: string): Promise<void> {
  const res = await fetch(api.artifactUrl(id, name), { headers: authHeaders() });
  if (!res.ok) throw await toApiError(res);
  const url = URL.createObjectURL(await res.blob());
  try {
    const a = document.createElement('a');
    a.href = url;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
  } finally {
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  }
}
