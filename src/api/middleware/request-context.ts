/**
 * Per-request context: the correlation id (SPEC §4.14 `X-Correlation-ID`, generated when absent or
 * unusable), a child logger carrying it, the security headers on every response, and an access log.
 */
import { randomUUID } from 'node:crypto';
import type { Context, MiddlewareHandler } from 'hono';
import type { Logger } from '../../logger.ts';
import type { AppEnv } from '../deps.ts';
import { requestHeader } from '../request-header.ts';

const CORRELATION_RE = /^[A-Za-z0-9._:-]{1,128}$/;

/** Sets `correlationId` and `logger`, and the SPEC §4.14 response headers. */
export function requestContext(root: Logger): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const given = requestHeader(c, 'x-correlation-id');
    const id = given && CORRELATION_RE.test(given) ? given : randomUUID();
    const log = root.child({ correlation_id: id });
    c.set('correlationId', id);
    c.set('logger', log);
    const started = performance.now();
    await next();
    setHeaders(c, id);
    // The request's logger as later middleware left it (requestTracing adds trace_id).
    c.get('logger').debug({ method: c.req.method, path: c.req.path, status: c.res.status, ms: Math.round(performance.now() - started) }, 'request');
  };
}

/**
 * Sets the §4.14 headers on the finished response in place. (`c.header()` after the handler rebuilds
 * the response around its body, which turns @hono/node-server's light string response into a
 * stream-bodied one: several times the cost of the request on the async hot path.)
 */
function setHeaders(c: Context<AppEnv>, id: string): void {
  const headers = securityHeaders(id);
  try {
    for (const [k, v] of headers) c.res.headers.set(k, v);
  } catch {
    // Immutable headers (a response passed through from fetch()): let hono rebuild it.
    for (const [k, v] of headers) c.header(k, v);
  }
}

/** The SPEC §4.14 response headers for a request with correlation id `id`. */
export function securityHeaders(id: string): [string, string][] {
  return [
    ['X-Correlation-ID', id],
    ['X-Content-Type-Options', 'nosniff'],
    ['X-Frame-Options', 'DENY'],
  ];
}
