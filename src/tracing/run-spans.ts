/**
 * The spans of one run's phases, planned from what was observed: the record's times (queue wait),
 * the runtime's observation (sandbox start, requirement install, execution, from its own clocks and
 * the runner's phase reports) and the steps a runtime reports (Kubernetes: the Job create, the
 * scheduling wait, the attach, from pod conditions). Pure, so the plan is table-tested; the caller
 * records it with explicit start and end times under the run's span.
 */
import type { Attributes } from '@opentelemetry/api';
import type { RawRun } from '../runtime/runtime.ts';

/** Span names, one per stage of a run (stable: dashboards and tests use them). */
export const SPAN = {
  request: 'http.request',
  admission: 'sandpod.admission',
  run: 'sandpod.run',
  queueWait: 'sandpod.queue_wait',
  sandbox: 'sandpod.sandbox',
  install: 'sandpod.install',
  execution: 'sandpod.execution',
  collection: 'sandpod.collection',
  settle: 'sandpod.settle',
  webhook: 'sandpod.webhook.delivery',
} as const;

/** One span to record. */
export interface PlannedSpan {
  name: string;
  start: number;
  end: number;
  attributes?: Attributes;
}

/** What the run's record and its holder saw besides the runtime's report. */
export interface RunFacts {
  mode: 'sync' | 'async';
  /** When the record was written (the submission). */
  createdAt: number;
  /** When this process took the run (the queue's claim; a sync run's start). */
  claimedAt: number;
  /** When the runtime handed the finished run back (after `/output` was collected). */
  returnedAt: number;
}

/** The spans of a run's stages, in order; stages that did not happen are left out. */
export function planRunSpans(raw: RawRun | null, f: RunFacts): PlannedSpan[] {
  const out: PlannedSpan[] = [];
  if (f.mode === 'async' && f.claimedAt > f.createdAt) out.push({ name: SPAN.queueWait, start: f.createdAt, end: f.claimedAt });
  if (!raw) return out;
  const o = raw.observation;
  const t0 = o.startedAt.getTime();
  const startupEnd = t0 + Math.max(0, o.startupMs);
  const install = Math.min(Math.max(0, o.depInstallMs), Math.max(0, o.startupMs));
  const path = o.warm === undefined ? 'unknown' : o.warm ? 'warm' : 'cold';
  out.push({ name: SPAN.sandbox, start: t0, end: startupEnd - install, attributes: { 'sandpod.sandbox.path': path, 'sandpod.sandbox.warm': o.warm === true } });
  if (install > 0) out.push({ name: SPAN.install, start: startupEnd - install, end: startupEnd });
  const reachedExecution = o.phase !== 'startup' || o.executionMs > 0;
  const execEnd = startupEnd + Math.max(0, o.executionMs);
  if (reachedExecution) {
    const attrs: Attributes = { 'process.exit.code': o.exitCode ?? -1 };
    if (o.timedOut) attrs['sandpod.timed_out'] = o.timedOut;
    if (o.oomKilled) attrs['sandpod.oom_killed'] = true;
    out.push({ name: SPAN.execution, start: startupEnd, end: execEnd, attributes: attrs });
  }
  const collectFrom = reachedExecution ? execEnd : startupEnd;
  // Always there (a warm run's may take under a millisecond), never ending before it starts.
  out.push({ name: SPAN.collection, start: collectFrom, end: Math.max(collectFrom, f.returnedAt), attributes: { 'sandpod.artifacts': raw.artifacts.length } });
  for (const s of o.steps ?? []) {
    out.push({ name: s.name, start: s.start.getTime(), end: Math.max(s.start.getTime(), s.end.getTime()), ...(s.attributes ? { attributes: s.attributes } : {}) });
  }
  return out;
}
