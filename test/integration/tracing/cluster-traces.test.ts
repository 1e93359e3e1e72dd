/**
 * One trace per run on the Kubernetes runtime (the real service and runtime against the in-repo fake
 * API server), exported over OTLP/HTTP to a real receiver: the run's tree holds the Job/pod create
 * and the scheduling wait, timed from the pod's creation and its PodScheduled condition, and the
 * program gets the run's TRACEPARENT on the runner's command line; a warm hit (a claimed pool pod whose
 * real runner gets the program through attach) has the attach span and passes TRACEPARENT in the go line.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobNameFor } from '../../../src/runtime/kubernetes/names.ts';
import type { Tracing } from '../../../src/tracing/setup.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { OtlpReceiver, startTracingTo } from '../../support/otlp-receiver.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
let fake: FakeKube;
let database: TestDatabase;
let svc: TestService;
let receiver: OtlpReceiver;
let tracing: Tracing;
let restoreKubeconfig: (() => void) | undefined;

beforeAll(async () => {
  receiver = await OtlpReceiver.start();
  tracing = await startTracingTo(receiver);
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  fake.upsertJobType('sandpod', 'default', { pythonVersion: '3.11', memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
  restoreKubeconfig = useFakeKubeconfig(fake);
  database = await freshDatabase();
  svc = await startTestService({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false } }, {}, database);
}, 120_000);

afterAll(async () => {
  await svc?.close();
  await database?.drop();
  await fake?.close();
  restoreKubeconfig?.();
  await tracing?.shutdown();
  await receiver?.close();
});

it('an async cluster run: request, admission, run with queue wait, Job create, scheduling wait, sandbox, execution, collection, settle', async () => {
  const res = await svc.post('/execute/async', { code: 'print("hi")' });
  expect(res.status).toBe(202);
  const { job_id: id } = (await res.json()) as J;
  const pod = await fake.waitForPod(jobNameFor(id));
  // The scheduler takes its time: the wait shows in the trace (pod times are in seconds).
  await new Promise((r) => setTimeout(r, 1100));
  fake.schedule(pod);
  fake.mainRunning(pod);
  fake.setOutput(pod, { phase: 'completed', stdout: 'hi\n', stderr: '', report: { exit_code: 0, timed_out: false, execution_ms: 3 }, files: {} });
  fake.mainTerminated(pod, 0);
  const rec = (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=60&view=full`)).json()) as J;
  expect(rec.status).toBe('succeeded');
  const traceId = rec.trace_id as string;
  expect(traceId).toMatch(/^[0-9a-f]{32}$/);
  for (let i = 0; i < 300 && !receiver.trace(traceId).some((s) => s.name === 'sandpod.run'); i++) {
    await tracing.flush();
    await new Promise((r) => setTimeout(r, 100));
  }
  expect(receiver.tree(traceId)).toBe(
    [
      'POST /execute/async',
      '  sandpod.admission',
      '  sandpod.run',
      '    sandpod.collection',
      '    sandpod.execution',
      '    sandpod.kube.create',
      '    sandpod.kube.schedule',
      '    sandpod.queue_wait',
      '    sandpod.sandbox',
      '    sandpod.settle',
    ].join('\n'),
  );
  const run = receiver.one(traceId, 'sandpod.run');
  expect(run.attributes).toMatchObject({ 'sandpod.execution_id': id, 'sandpod.status': 'succeeded' });
  expect(receiver.one(traceId, 'sandpod.sandbox').attributes['sandpod.sandbox.path']).toBe('cold');
  const schedule = receiver.one(traceId, 'sandpod.kube.schedule');
  expect(schedule.attributes).toMatchObject({ 'k8s.job.name': jobNameFor(id), 'k8s.pod.name': pod });
  // PodScheduled came 1.1 s after the pod's creation; both are whole seconds, and the span starts no
  // earlier than the run: at least the 0.1 s past the truncation remains.
  expect(schedule.endMs - schedule.startMs).toBeGreaterThanOrEqual(100);
  expect(schedule.endMs % 1000).toBe(0);
  expect(receiver.one(traceId, 'sandpod.kube.create').endMs).toBeLessThanOrEqual(schedule.startMs + 1000);
  // The program sees the run's span as TRACEPARENT (the runner's --env, after the job type's).
  const job = fake.get('jobs', 'sandpod-jobs', jobNameFor(id))!;
  const main = (job.spec.template.spec.containers as J[]).find((c) => c.name === 'main')!;
  expect(main.command).toContain(`TRACEPARENT=00-${traceId}-${run.spanId}-01`);
}, 120_000);

describe('warm pool pod', () => {
  let warmFake: FakeKube;
  let warmDb: TestDatabase;
  let warm: TestService;
  let restore: (() => void) | undefined;
  beforeAll(async () => {
    // Pool pods run the real runner (in --wait mode, fed through attach).
    warmFake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
    warmFake.addRuntimeClass('gvisor');
    warmFake.upsertJobType('sandpod', 'default', { pythonVersion: '3.11', memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
    restore = useFakeKubeconfig(warmFake);
    warmDb = await freshDatabase();
    warm = await startTestService({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, warm_pool_size: 1 } }, {}, warmDb);
  }, 120_000);
  afterAll(async () => {
    await warm?.close();
    await warmDb?.drop();
    await warmFake?.close();
    restore?.();
  });

  it('a warm hit: the attach span, the warm sandbox, and TRACEPARENT through the go line', async () => {
    // Ready as the pool counts it (/pool/stats: of the job type's current spec): until the JobType
    // resource is seen, the pool holds pods of the built-in `default`, which a run of the resource's
    // `default` never takes.
    for (let i = 0; i < 600; i++) {
      const stats = (await (await warm.get('/pool/stats')).json()) as { warm?: { job_type: string; ready: number }[] };
      if ((stats.warm?.find((w) => w.job_type === 'default')?.ready ?? 0) > 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const traceId = 'c0ffee00c0ffee00c0ffee00c0ffee00';
    const res = await warm.post('/execute', { code: 'import os\nprint(os.environ.get("TRACEPARENT", "none"))' }, { traceparent: `00-${traceId}-2222333344445555-01` });
    expect(res.status).toBe(200);
    const body = (await res.json()) as J;
    expect(body.success).toBe(true);
    for (let i = 0; i < 300 && !receiver.trace(traceId).some((s) => s.name === 'POST /execute'); i++) {
      await tracing.flush();
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(receiver.tree(traceId)).toBe(
      ['POST /execute', '  sandpod.admission', '  sandpod.run', '    sandpod.collection', '    sandpod.execution', '    sandpod.kube.attach', '    sandpod.sandbox', '    sandpod.settle'].join('\n'),
    );
    expect(receiver.one(traceId, 'sandpod.sandbox').attributes['sandpod.sandbox.path']).toBe('warm');
    expect(receiver.one(traceId, 'sandpod.kube.attach').attributes['sandpod.kube.path']).toBe('warm');
    expect(String(body.stdout).trim()).toBe(`00-${traceId}-${receiver.one(traceId, 'sandpod.run').spanId}-01`);
  }, 120_000);
});
