/**
 * Span helpers over the OpenTelemetry API, each a no-op when tracing is off ({@link isTracing}).
 *
 * A run's trace crosses the queue and process restarts as a W3C `traceparent` string stored with its
 * record (migration 0008); {@link contextOf} turns it back into a parent context. Spans of what a
 * runtime observed (pod conditions, runner reports) are recorded after the fact with explicit start
 * and end times ({@link recordSpan}).
 */
import { context, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Attributes, type Context, type Span } from '@opentelemetry/api';
import { parseTraceParent } from '@opentelemetry/core';
import { isTracing, TRACER_NAME } from './setup.ts';

export { isTracing } from './setup.ts';

/** A W3C traceparent's parts, or null when `header` is not a valid one (version 00, non-zero ids). */
export function parseTraceparent(header: string | null | undefined): { traceId: string; spanId: string; sampled: boolean } | null {
  if (!header) return null;
  const sc = parseTraceParent(header.trim());
  if (!sc || !trace.isSpanContextValid(sc)) return null;
  return { traceId: sc.traceId, spanId: sc.spanId, sampled: (sc.traceFlags & 1) === 1 };
}

/**
 * A header's traceparent rewritten as version 00 from its parsed parts, or null when invalid: what is
 * stored and passed to the program is never the client's raw text (a future version may carry more).
 */
export function normalTraceparent(header: string | null | undefined): string | null {
  const p = parseTraceparent(header);
  return p ? `00-${p.traceId}-${p.spanId}-${p.sampled ? '01' : '00'}` : null;
}

/** The traceparent of a span (version 00). */
export function traceparentOf(span: Span): string {
  const sc = span.spanContext();
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

/** The context whose parent is the span a stored traceparent names (a new trace when none). */
export function contextOf(traceparent: string | null | undefined): Context {
  const sc = traceparent ? parseTraceParent(traceparent) : null;
  return sc && trace.isSpanContextValid(sc) ? trace.setSpanContext(ROOT_CONTEXT, { ...sc, isRemote: true }) : ROOT_CONTEXT;
}

/** Starts a live span under `parent` (the active context when omitted). Callers check {@link isTracing} first. */
export function startSpan(name: string, opts: { parent?: Context; attributes?: Attributes; startTime?: Date | number; kind?: SpanKind } = {}): Span {
  return trace.getTracer(TRACER_NAME).startSpan(
    name,
    { kind: opts.kind ?? SpanKind.INTERNAL, ...(opts.attributes ? { attributes: opts.attributes } : {}), ...(opts.startTime !== undefined ? { startTime: opts.startTime } : {}) },
    opts.parent ?? context.active(),
  );
}

/** Records a span that already happened (start and end observed) under `parent`. */
export function recordSpan(parent: Context, name: string, start: Date | number, end: Date | number, attributes?: Attributes, error?: string): void {
  if (!isTracing()) return;
  const s = startSpan(name, { parent, startTime: start, ...(attributes ? { attributes } : {}) });
  if (error) s.setStatus({ code: SpanStatusCode.ERROR, message: error });
  // An end observed before the start (clock skew between the node and the pod) is not a negative span.
  s.end(Math.max(new Date(end).getTime(), new Date(start).getTime()));
}

/**
 * Runs `fn` inside a span named `name` (a child of the active context) and ends it when `fn` settles;
 * a thrown error marks the span failed. Off: just `fn()`.
 */
export async function withSpan<T>(name: string, attributes: Attributes, fn: () => Promise<T>): Promise<T> {
  if (!isTracing()) return fn();
  const span = startSpan(name, { attributes });
  try {
    return await context.with(trace.setSpan(context.active(), span), fn);
  } catch (err) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
    throw err;
  } finally {
    span.end();
  }
}

/** The traceparent of the active span, when there is a recording one. */
export function activeTraceparent(): string | null {
  if (!isTracing()) return null;
  const span = trace.getSpan(context.active());
  return span && span.spanContext().traceId && trace.isSpanContextValid(span.spanContext()) ? traceparentOf(span) : null;
}
