/** The plan of a run's stage spans from what was observed (tracing/run-spans.ts), table-tested. */
import { describe, expect, it } from 'vitest';
import type { RawRun, RunObservation } from '../../../src/runtime/runtime.ts';
import { planRunSpans, type RunFacts } from '../../../src/tracing/run-spans.ts';
import { normalTraceparent, parseTraceparent } from '../../../src/tracing/spans.ts';
import { tracingRequested } from '../../../src/tracing/setup.ts';

const T0 = Date.parse('2026-12-01T10:00:00Z');

function raw(o: Partial<RunObservation> = {}): RawRun {
  return {
    observation: {
      exitCode: 0,
      timedOut: null,
      oomKilled: false,
      cancelled: false,
      dependencyError: null,
      infraError: null,
      phase: 'completed',
      startedAt: new Date(T0),
      endedAt: new Date(T0 + 1000),
      startupMs: 300,
      depInstallMs: 0,
      executionMs: 500,
      totalMs: 1000,
      ...o,
    },
    report: null,
    stdout: '',
    stderr: '',
    stdoutTruncated: false,
    stderrTruncated: false,
    resultJson: null,
    artifacts: [],
  };
}

const facts = (over: Partial<RunFacts> = {}): RunFacts => ({ mode: 'sync', createdAt: T0 - 5, claimedAt: T0 - 5, returnedAt: T0 + 900, ...over });

/** `name start..end` relative to T0, one per span. */
const plan = (r: RawRun | null, f: RunFacts) => planRunSpans(r, f).map((s) => `${s.name} ${s.start - T0}..${s.end - T0}`);

describe('planRunSpans', () => {
  it.each([
    ['sync cold run', raw({ warm: false }), facts(), ['sandpod.sandbox 0..300', 'sandpod.execution 300..800', 'sandpod.collection 800..900']],
    ['async: the queue wait from the record to the claim', raw(), facts({ mode: 'async', createdAt: T0 - 2000, claimedAt: T0 - 10 }), ['sandpod.queue_wait -2000..-10', 'sandpod.sandbox 0..300', 'sandpod.execution 300..800', 'sandpod.collection 800..900']],
    ['sync: no queue wait even when the claim is later', raw(), facts({ claimedAt: T0 }), ['sandpod.sandbox 0..300', 'sandpod.execution 300..800', 'sandpod.collection 800..900']],
    ['requirements installed at the end of startup', raw({ depInstallMs: 200 }), facts(), ['sandpod.sandbox 0..100', 'sandpod.install 100..300', 'sandpod.execution 300..800', 'sandpod.collection 800..900']],
    ['install longer than startup (bad report) stays inside startup', raw({ depInstallMs: 900 }), facts(), ['sandpod.sandbox 0..0', 'sandpod.install 0..300', 'sandpod.execution 300..800', 'sandpod.collection 800..900']],
    ['failed in startup: no execution span', raw({ phase: 'startup', executionMs: 0 }), facts(), ['sandpod.sandbox 0..300', 'sandpod.collection 300..900']],
    ['collection never ends before it starts', raw(), facts({ returnedAt: T0 + 700 }), ['sandpod.sandbox 0..300', 'sandpod.execution 300..800', 'sandpod.collection 800..800']],
    ['no run (breaker open): only the queue wait', null, facts({ mode: 'async', createdAt: T0 - 100, claimedAt: T0 }), ['sandpod.queue_wait -100..0']],
  ])('%s', (_name, r, f, want) => {
    expect(plan(r, f)).toEqual(want);
  });

  it('warm or cold is an attribute of the sandbox span', () => {
    const path = (w: boolean | undefined) => planRunSpans(raw(w === undefined ? {} : { warm: w }), facts()).find((s) => s.name === 'sandpod.sandbox')?.attributes?.['sandpod.sandbox.path'];
    expect([path(true), path(false), path(undefined)]).toEqual(['warm', 'cold', 'unknown']);
  });

  it('the runtime\'s own steps follow, an end before its start clamped', () => {
    const steps = [
      { name: 'sandpod.kube.create', start: new Date(T0 + 10), end: new Date(T0 + 40), attributes: { 'k8s.job.name': 'j' } },
      { name: 'sandpod.kube.schedule', start: new Date(T0 + 40), end: new Date(T0 + 30) },
    ];
    const out = planRunSpans(raw({ steps }), facts()).slice(-2);
    expect(out).toEqual([
      { name: 'sandpod.kube.create', start: T0 + 10, end: T0 + 40, attributes: { 'k8s.job.name': 'j' } },
      { name: 'sandpod.kube.schedule', start: T0 + 40, end: T0 + 40 },
    ]);
  });

  it('execution carries the exit code and what ended it', () => {
    const exec = planRunSpans(raw({ exitCode: 137, oomKilled: true, timedOut: 'execution' }), facts()).find((s) => s.name === 'sandpod.execution');
    expect(exec?.attributes).toEqual({ 'process.exit.code': 137, 'sandpod.oom_killed': true, 'sandpod.timed_out': 'execution' });
  });
});

describe('traceparent and the switch', () => {
  it.each([
    ['00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', sampled: true }],
    [' 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ', { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', sampled: false }],
    ['00-00000000000000000000000000000000-00f067aa0ba902b7-01', null],
    ['00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01', null],
    ['ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', null],
    ['garbage', null],
    ['', null],
    [undefined, null],
  ])('parseTraceparent(%j)', (header, want) => {
    expect(parseTraceparent(header)).toEqual(want);
  });

  it.each([
    [{}, false],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' }, true],
    [{ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://collector:4318/v1/traces' }, true],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: '  ' }, false],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'true' }, false],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'TRUE ' }, false],
    [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'false' }, true],
  ])('tracingRequested(%j) is %s', (env, want) => {
    expect(tracingRequested(env)).toBe(want);
  });
});

describe('normalTraceparent', () => {
  it.each([
    ['00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'],
    // A later version may carry more after the flags: what is stored and passed on is version 00 only.
    ['01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-x y=z', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'],
    ['00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00'],
    ['nope', null],
  ])('%j → %j', (header, want) => {
    expect(normalTraceparent(header)).toBe(want);
  });
});
