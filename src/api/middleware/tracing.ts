/**
 * The HTTP request's span (OpenTelemetry, kind SERVER): a W3C `traceparent` on the request is
 * continued, otherwise a trace starts. The span is the active context while the request is handled,
 * so the spans of what it does (admission, a sync run) are its children, and its traceparent is what a
 * submission stores with its record. The request's logger carries `trace_id`.
 *
 * Tracing off: no span; a valid `traceparent` from the client is still passed on as is (the record and
 * the program continue the client's trace), which costs one header read.
 */
import { context, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import type { MiddlewareHandler } from 'hono';
import { matchedRoutes } from 'hono/route';
import { contextOf, isTracing, normalTraceparent, parseTraceparent, startSpan, traceparentOf } from '../../tracing/spans.ts';
import type { AppEnv } from '../deps.ts';
import { requestHeader } from '../request-header.ts';
import { routeTemplate } from './http-metrics.ts';

/** Mount after `requestContext` (it replaces the request's logger with one that carries `trace_id`). */
export function requestTracing(): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const incoming = requestHeader(c, 'traceparent');
    if (!isTracing()) {
      const given = parseTraceparent(incoming);
      const normal = normalTraceparent(incoming);
      if (given && normal) {
        c.set('traceparent', normal);
        c.set('logger', c.get('logger').child({ trace_id: given.traceId }));
      }
      return next();
    }
    const parent = contextOf(incoming);
    const span = startSpan(c.req.method, {
      parent,
      kind: SpanKind.SERVER,
      attributes: { 'http.request.method': c.req.method, 'url.path': c.req.path, 'sandpod.correlation_id': c.get('correlationId') },
    });
    c.set('traceparent', traceparentOf(span));
    c.set('logger', c.get('logger').child({ trace_id: span.spanContext().traceId }));
    try {
      await context.with(trace.setSpan(parent, span), next);
    } finally {
      const route = routeTemplate(matchedRoutes(c));
      span.updateName(`${c.req.method} ${route}`);
      span.setAttribute('http.route', route);
      span.setAttribute('http.response.status_code', c.res.status);
      if (c.res.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
      span.end();
    }
  };
}
