/**
 * One trace per run (issue 21), exported over OTLP/HTTP to a real receiver the test runs: the span
 * tree of a sync run and of an async run (whose trace crosses the queue with its record), the
 * program's TRACEPARENT, and the record's trace_id. Real service, real database, real sandbox.
 */
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '../../../src/logger.ts';
import type { Tracing } from '../../../src/tracing/setup.ts';
import { OtlpReceiver, startTracingTo } from '../../support/otlp-receiver.ts';
import { buildWheels } from '../../support/wheel.ts';
import { startTestService, type TestService } from '../../support/service.ts';

let receiver: OtlpReceiver;
let tracing: Tracing;
let svc: TestService;

beforeAll(async () => {
  receiver = await OtlpReceiver.start();
  tracing = await startTracingTo(receiver);
  svc = await startTestService();
}, 120_000);

afterAll(async () => {
  await svc?.close();
  await tracing?.shutdown();
  await receiver?.close();
});

/** Waits until the trace holds a span named `name` (the exporter batches), flushing meanwhile. */
async function waitForSpan(traceId: string, name: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    await tracing.flush();
    if (receiver.trace(traceId).some((s) => s.name === name)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`no span ${name} in trace ${traceId}:\n${receiver.tree(traceId)}`);
}

const PRINT_TRACEPARENT = 'import os\nprint(os.environ.get("TRACEPARENT", "none"))';

describe('tracing on', () => {
  it('a sync run continues the client\'s traceparent: request, admission, run and its stages in one tree', async () => {
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    const clientSpan = '00f067aa0ba902b7';
    const res = await svc.post('/execute', { code: PRINT_TRACEPARENT }, { traceparent: `00-${traceId}-${clientSpan}-01` });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { execution_id: string; stdout: string; success: boolean };
    expect(body.success).toBe(true);
    await waitForSpan(traceId, 'POST /execute');
    expect(receiver.rejected).toEqual([]);
    expect(receiver.tree(traceId)).toBe(
      ['POST /execute', '  sandpod.admission', '  sandpod.run', '    sandpod.collection', '    sandpod.execution', '    sandpod.sandbox', '    sandpod.settle'].join('\n'),
    );
    const http = receiver.one(traceId, 'POST /execute');
    expect(http.parentSpanId).toBe(clientSpan);
    expect(http.kind).toBe(2); // SERVER
    expect(http.attributes).toMatchObject({ 'http.route': '/execute', 'http.response.status_code': 200 });
    expect(http.resource['service.name']).toBe('sandpod');
    const run = receiver.one(traceId, 'sandpod.run');
    expect(run.attributes).toMatchObject({ 'sandpod.execution_id': body.execution_id, 'sandpod.mode': 'sync', 'sandpod.status': 'succeeded' });
    expect(receiver.one(traceId, 'sandpod.sandbox').attributes['sandpod.sandbox.path']).toBe('cold');
    // The program continues the run's span.
    expect(body.stdout.trim()).toBe(`00-${traceId}-${run.spanId}-01`);
    // Stages lie inside the run, in order.
    const exec = receiver.one(traceId, 'sandpod.execution');
    const settle = receiver.one(traceId, 'sandpod.settle');
    expect(exec.startMs).toBeGreaterThanOrEqual(receiver.one(traceId, 'sandpod.sandbox').startMs);
    expect(settle.startMs).toBeGreaterThanOrEqual(exec.endMs - 1);
    expect(run.endMs).toBeGreaterThanOrEqual(settle.endMs);
    const full = (await (await svc.get(`/jobs/${body.execution_id}?view=full`)).json()) as { trace_id: string | null };
    expect(full.trace_id).toBe(traceId);
  });

  it('an async run carries the trace of the request that queued it across the queue', async () => {
    const res = await svc.post('/execute/async', { code: PRINT_TRACEPARENT });
    expect(res.status).toBe(202);
    const { job_id } = (await res.json()) as { job_id: string };
    const done = await svc.get(`/jobs/${job_id}/result?wait=true&timeout=60`);
    expect(done.status).toBe(200);
    const full = (await (await svc.get(`/jobs/${job_id}?view=full`)).json()) as { trace_id: string | null; stdout: string };
    expect(full.trace_id).toMatch(/^[0-9a-f]{32}$/);
    const traceId = full.trace_id!;
    await waitForSpan(traceId, 'sandpod.run');
    expect(receiver.tree(traceId)).toBe(
      [
        'POST /execute/async',
        '  sandpod.admission',
        '  sandpod.run',
        '    sandpod.collection',
        '    sandpod.execution',
        '    sandpod.queue_wait',
        '    sandpod.sandbox',
        '    sandpod.settle',
      ].join('\n'),
    );
    const http = receiver.one(traceId, 'POST /execute/async');
    expect(http.parentSpanId).toBe('');
    const run = receiver.one(traceId, 'sandpod.run');
    expect(run.attributes).toMatchObject({ 'sandpod.execution_id': job_id, 'sandpod.mode': 'async' });
    const wait = receiver.one(traceId, 'sandpod.queue_wait');
    expect(wait.startMs).toBe(run.startMs);
    expect(wait.endMs).toBeLessThanOrEqual(receiver.one(traceId, 'sandpod.sandbox').startMs + 1);
    expect(full.stdout.trim()).toBe(`00-${traceId}-${run.spanId}-01`);
  });
});

describe('tracing on, warm sandbox (local runtime)', () => {
  let warm: TestService;
  beforeAll(async () => {
    warm = await startTestService({ warm_pool: { sizes: { default: 1 } } });
  }, 120_000);
  afterAll(async () => {
    await warm?.close();
  });

  it.skipIf(process.getuid?.() !== 0)('a warm hit is a warm sandbox span, and the program gets TRACEPARENT through the go line', async () => {
    // Until the pool has a ready sandbox (it starts with the service).
    for (let i = 0; i < 1200 && !(warm.runtime.warmPoolStats?.() ?? []).some((s) => s.job_type === 'default' && s.ready > 0); i++) await new Promise((r) => setTimeout(r, 100));
    const traceId = 'a1b2c3d4e5f60718293a4b5c6d7e8f90';
    const res = await warm.post('/execute', { code: PRINT_TRACEPARENT }, { traceparent: `00-${traceId}-1111222233334444-01` });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { stdout: string; success: boolean };
    expect(body.success).toBe(true);
    await waitForSpan(traceId, 'POST /execute');
    expect(receiver.tree(traceId)).toBe(
      ['POST /execute', '  sandpod.admission', '  sandpod.run', '    sandpod.collection', '    sandpod.execution', '    sandpod.sandbox', '    sandpod.settle'].join('\n'),
    );
    expect(receiver.one(traceId, 'sandpod.sandbox').attributes).toMatchObject({ 'sandpod.sandbox.path': 'warm', 'sandpod.sandbox.warm': true });
    expect(body.stdout.trim()).toBe(`00-${traceId}-${receiver.one(traceId, 'sandpod.run').spanId}-01`);
    expect((warm.runtime.warmPoolStats?.() ?? []).find((s) => s.job_type === 'default')?.hits).toBe(1);
  }, 150_000);
});

describe('tracing on, requirements installed at run time', () => {
  let withPip: TestService;
  beforeAll(async () => {
    const index = buildWheels([{ name: 'sandpod-tracepkg', version: '1.0.0' }]);
    withPip = await startTestService({ pip: { find_links: [index], no_index: true } });
  }, 120_000);
  afterAll(async () => {
    await withPip?.close();
  });

  it('the install is its own span, inside the sandbox\'s startup and before the execution', async () => {
    const traceId = 'abcdefabcdefabcdefabcdefabcdef01';
    const res = await withPip.post('/execute', { code: 'import sandpod_tracepkg\nprint(sandpod_tracepkg.VALUE)', requirements: ['sandpod-tracepkg'], startup_timeout: 120 }, { traceparent: `00-${traceId}-3333444455556666-01` });
    const body = (await res.json()) as { stdout: string; success: boolean; stderr: string };
    expect(body.success, body.stderr).toBe(true);
    expect(body.stdout.trim()).toBe('sandpod-tracepkg-1.0.0');
    await waitForSpan(traceId, 'POST /execute');
    expect(receiver.tree(traceId)).toBe(
      ['POST /execute', '  sandpod.admission', '  sandpod.run', '    sandpod.collection', '    sandpod.execution', '    sandpod.install', '    sandpod.sandbox', '    sandpod.settle'].join('\n'),
    );
    const install = receiver.one(traceId, 'sandpod.install');
    expect(install.endMs).toBeGreaterThan(install.startMs);
    expect(install.startMs).toBeGreaterThanOrEqual(receiver.one(traceId, 'sandpod.sandbox').endMs);
    expect(receiver.one(traceId, 'sandpod.execution').startMs).toBeGreaterThanOrEqual(install.endMs);
  }, 180_000);
});

describe('logs', () => {
  it('every line the service writes while handling a traced run carries its trace_id', async () => {
    const lines: Record<string, unknown>[] = [];
    const raw: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk.toString('utf8').split('\n')) {
          if (!l.trim()) continue;
          raw.push(l);
          lines.push(JSON.parse(l) as Record<string, unknown>);
        }
        done();
      },
    });
    const logged = await startTestService({ log_level: 'debug' }, { logger: createLogger('debug', 'json', sink) });
    try {
      const traceId = '5bf92f3577b34da6a3ce929d0e0e4736';
      const res = await logged.post('/execute', { code: 'print(1)' }, { traceparent: `00-${traceId}-00f067aa0ba902b7-01` });
      const { execution_id } = (await res.json()) as { execution_id: string };
      const ofRun = lines.filter((l) => l.execution_id === execution_id);
      // 'run starting' and 'run finished' at least, and the request's own line.
      expect(ofRun.map((l) => l.msg)).toEqual(expect.arrayContaining(['run starting', 'run finished']));
      for (const l of ofRun) expect(l.trace_id, JSON.stringify(l)).toBe(traceId);
      const request = lines.find((l) => l.msg === 'request' && l.path === '/execute');
      expect(request?.trace_id).toBe(traceId);
      // A line has the key once (the run's logger binds it and the mixin adds it: never both).
      for (const l of raw.filter((r) => r.includes(execution_id))) expect(l.split('"trace_id"').length - 1, l).toBe(1);
    } finally {
      await logged.close();
    }
  });
});

describe('tracing off', () => {
  it('a client traceparent still reaches the record and the program; nothing is exported', async () => {
    await tracing.shutdown();
    const before = receiver.spans.length;
    const traceId = '0af7651916cd43dd8448eb211c80319c';
    const res = await svc.post('/execute', { code: PRINT_TRACEPARENT }, { traceparent: `00-${traceId}-b7ad6b7169203331-01` });
    const body = (await res.json()) as { stdout: string; execution_id: string };
    expect(body.stdout.trim()).toBe(`00-${traceId}-b7ad6b7169203331-01`);
    const full = (await (await svc.get(`/jobs/${body.execution_id}?view=full`)).json()) as { trace_id: string | null };
    expect(full.trace_id).toBe(traceId);
    const plain = (await (await svc.post('/execute', { code: PRINT_TRACEPARENT })).json()) as { stdout: string; execution_id: string };
    expect(plain.stdout.trim()).toBe('none');
    expect(((await (await svc.get(`/jobs/${plain.execution_id}?view=full`)).json()) as { trace_id: string | null }).trace_id).toBeNull();
    await new Promise((r) => setTimeout(r, 300));
    expect(receiver.spans.length).toBe(before);
  });
});
