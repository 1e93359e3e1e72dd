/**
 * HTTP request metrics: `sandpod_http_requests_total{method,route,status}` and
 * `sandpod_http_request_duration_seconds{method,route}`.
 *
 * `route` is the template of the route the request addressed (`/jobs/:id`, from hono's router),
 * never the raw path: ids in paths would give every request a series of its own. A request that
 * addresses no route gets UNMATCHED_ROUTE, and methods outside the standard set are counted as
 * `OTHER`, so clients cannot grow the label space either.
 */
import type { MiddlewareHandler } from 'hono';
import { matchedRoutes } from 'hono/route';
import type { Metrics } from '../../metrics.ts';

/** The `route` label of requests that match no route (404s of unknown paths). */
export const UNMATCHED_ROUTE = 'unmatched';

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);

/** hono's method of routes registered with `use()` (middleware on every method). */
const ANY_METHOD = 'ALL';

/**
 * Counts and times every request. Mount it with `app.use('*', ...)` early, so that it sees the
 * final status of every answer, errors and 404s included. The duration ends when the handler
 * returns its response (a streamed body may still be flowing).
 */
export function httpMetrics(metrics: Metrics): MiddlewareHandler {
  return async (c, next) => {
    const start = performance.now();
    try {
      await next();
    } finally {
      const method = METHODS.has(c.req.method) ? c.req.method : 'OTHER';
      const route = routeTemplate(matchedRoutes(c));
      metrics.httpRequests.inc({ method, route, status: String(c.res.status) });
      metrics.httpDuration.observe({ method, route }, (performance.now() - start) / 1000);
    }
  };
}

/**
 * The template of the first endpoint among the routes hono matched (in registration order, the one
 * that answers). Middleware mounted with `use()` on a wildcard (`*`, `/jobs/*`) matches every path
 * below it, so it does not make a request "matched".
 */
export function routeTemplate(routes: ReadonlyArray<{ method: string; path: string }>): string {
  const endpoint = routes.find((r) => !(r.method === ANY_METHOD && r.path.endsWith('*')));
  return endpoint?.path ?? UNMATCHED_ROUTE;
}
