/** Where a submission came from: correlation id, client address, and the trace it continues. */
import type { Context } from 'hono';
import type { RequestMeta } from '../executions/requests.ts';
import { clientIp } from './client-ip.ts';
import type { AppEnv } from './deps.ts';

/** The {@link RequestMeta} of a request (set by the requestContext and requestTracing middleware). */
export function requestMeta(c: Context<AppEnv>): RequestMeta {
  return { correlationId: c.get('correlationId'), clientIp: clientIp(c), traceparent: c.get('traceparent') ?? null };
}
