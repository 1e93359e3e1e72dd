/**
 * One run's trace, as its holder records it: the run's span (under the traceparent stored with the
 * record, so an async run continues the trace of the request that queued it, across the queue and
 * restarts), the spans of its stages planned from what was observed ({@link planRunSpans}), and the
 * settle of its record. Off, only the stored traceparent is passed on (to the program and the logs).
 */
import { SpanStatusCode, trace, type Span } from '@opentelemetry/api';
import type { RawRun } from '../runtime/runtime.ts';
import { planRunSpans, SPAN, type RunFacts } from './run-spans.ts';
import { contextOf, isTracing, normalTraceparent, parseTraceparent, recordSpan, startSpan, traceparentOf } from './spans.ts';

/** What a run's trace needs of its record. */
export interface TracedRow {
  id: string;
  mode: string;
  job_type: string;
  created_at: Date | string;
  traceparent?: string | null;
}

/** The trace of one run held by this process. */
export class RunTrace {
  private constructor(
    /** What the program sees as `TRACEPARENT`: the run's span (or, tracing off, the stored traceparent). */
    readonly traceparent: string | undefined,
    readonly traceId: string | undefined,
    private readonly span: Span | null,
    private readonly mode: 'sync' | 'async',
  ) {}

  /** Starts the run's span (from the record's creation, so the queue wait is inside it). */
  static start(row: TracedRow): RunTrace {
    const stored = parseTraceparent(row.traceparent);
    const mode = row.mode === 'sync' ? 'sync' : 'async';
    if (!isTracing()) return new RunTrace(normalTraceparent(row.traceparent) ?? undefined, stored?.traceId, null, mode);
    const span = startSpan(SPAN.run, {
      parent: contextOf(row.traceparent),
      startTime: new Date(row.created_at),
      attributes: { 'sandpod.execution_id': row.id, 'sandpod.job_type': row.job_type, 'sandpod.mode': row.mode },
    });
    return new RunTrace(traceparentOf(span), span.spanContext().traceId, span, mode);
  }

  /** Records the stages of the run (queue wait, sandbox, install, execution, collection, runtime steps). */
  stages(raw: RawRun | null, facts: Omit<RunFacts, 'mode'>): void {
    if (!this.span) return;
    const parent = trace.setSpan(contextOf(null), this.span);
    for (const s of planRunSpans(raw, { ...facts, mode: this.mode })) recordSpan(parent, s.name, s.start, s.end, s.attributes);
  }

  /** Records the settle of the record (the verdict's write) between `start` and `end`. */
  settled(start: number, end: number, status: string | null): void {
    if (!this.span) return;
    recordSpan(trace.setSpan(contextOf(null), this.span), SPAN.settle, start, end, status ? { 'sandpod.status': status } : undefined);
  }

  /** Ends the run's span with the record's outcome. */
  end(status: string, errorType?: string | null): void {
    if (!this.span) return;
    this.span.setAttribute('sandpod.status', status);
    if (errorType) {
      this.span.setAttribute('error.type', errorType);
      this.span.setStatus({ code: SpanStatusCode.ERROR, message: errorType });
    }
    this.span.end();
  }
}
