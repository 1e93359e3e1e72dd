/**
 * One error body for every failure (CONVENTIONS.md): `{ detail, code, correlation_id, ...extra }`.
 * Known errors are {@link AppError}s; an unreachable database is a 503 `database_unavailable`;
 * anything else is logged whole and becomes a 500.
 */
import type { Context } from 'hono';
import { HTTPException } from 'hono/http-exception';
import * as v from 'valibot';
import { AppError } from '../errors.ts';
import { isDatabaseUnavailable } from '../executions/index.ts';
import type { AppEnv } from './deps.ts';
import { securityHeaders } from './middleware/request-context.ts';

/**
 * `Retry-After` (seconds) of the 503s a client should simply retry: a draining instance (another one,
 * or this one once restarted, takes the work), a full queue, and a cap on open event streams.
 */
const RETRY_AFTER_S = { shutting_down: 2, queue_full: 5, too_many_requests: 5 } as const;

/** Builds the error response for `err`. */
export function errorResponse(err: unknown, c: Context<AppEnv>): Response {
  const correlationId = c.get('correlationId') ?? 'unknown';
  let status = 500;
  let body: Record<string, unknown>;
  if (err instanceof AppError) {
    status = err.status;
    body = { detail: err.message, code: err.code, ...err.extra };
  } else if (err instanceof v.ValiError) {
    status = 400;
    body = { detail: formatValiIssues(err.issues), code: 'validation_error' };
  } else if (err instanceof HTTPException) {
    status = err.status;
    body = { detail: err.message || 'request rejected', code: status === 413 ? 'payload_too_large' : 'bad_request' };
  } else if (isDatabaseUnavailable(err)) {
    // A restart or outage of the database is the service's state, not a bug: the client may retry.
    c.get('logger')?.warn({ err }, 'database unavailable');
    status = 503;
    body = { detail: 'the database is unavailable; retry later', code: 'database_unavailable' };
  } else {
    c.get('logger')?.error({ err }, 'unhandled error');
    body = { detail: `internal error; quote correlation id ${correlationId} when reporting it`, code: 'internal_error' };
  }
  const res = c.json({ ...body, correlation_id: correlationId }, status as 400);
  for (const [k, v] of securityHeaders(correlationId)) res.headers.set(k, v);
  const retryAfter = err instanceof AppError ? RETRY_AFTER_S[err.code as keyof typeof RETRY_AFTER_S] : undefined;
  if (retryAfter !== undefined) res.headers.set('Retry-After', String(retryAfter));
  return res;
}

/** `field: problem; other.field: problem` */
export function formatValiIssues(issues: readonly v.BaseIssue<unknown>[]): string {
  return issues
    .map((i) => {
      const key = v.getDotPath(i);
      return key ? `${key}: ${i.message}` : i.message;
    })
    .join('; ');
}
