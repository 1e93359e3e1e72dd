/** The client's errors: an error answer of the service, and a service that cannot be reached. */

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
