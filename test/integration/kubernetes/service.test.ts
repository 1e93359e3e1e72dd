/**
 * The whole service on the Kubernetes runtime: the real app, database and lifecycle, the real
 * runtime wired by main.ts (KUBECONFIG → the in-repo fake API server). The records and HTTP answers
 * must be those of the local runtime.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobNameFor } from '../../../src/runtime/kubernetes/names.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
let fake: FakeKube;
let database: TestDatabase;
let svc: TestService;
let restoreKubeconfig: (() => void) | undefined;

const K8S = {
  runtime: 'kubernetes',
  // Runs only: no ready session pods (their pending pods would be taken for the runs' here).
  warm_pool: { session_sizes: {} },
  kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, watch_job_types: true, preflight: false },
};

beforeAll(async () => {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  fake.upsertJobType('sandpod', 'default', { pythonVersion: '3.11', memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
  fake.upsertJobType('sandpod', 'analytics', { pythonVersion: '3.11', requirements: ['numpy'], memoryLimit: '1g', cpuLimit: 2, timeout: 60, image: 'registry.example/analytics:1' });
  restoreKubeconfig = useFakeKubeconfig(fake);
  database = await freshDatabase();
  svc = await startTestService(K8S, {}, database);
});
afterAll(async () => {
  await svc?.close();
  await database?.drop();
  await fake?.close();
  restoreKubeconfig?.();
});

async function submit(s: TestService, body: J): Promise<string> {
  const res = await s.post('/execute/async', body);
  expect(res.status).toBe(202);
  return ((await res.json()) as J).job_id as string;
}

async function succeed(pod: string, o: { stdout?: string; exit?: number; report?: J; result?: string; files?: Record<string, string> } = {}) {
  fake.schedule(pod);
  fake.mainRunning(pod);
  fake.setOutput(
    pod,
    ({
      phase: o.exit ? 'failed' : 'completed',
      stdout: o.stdout ?? '',
      stderr: '',
      report: o.report ?? { exit_code: o.exit ?? 0, timed_out: false, execution_ms: 3 },
      ...(o.result ? { result: o.result } : {}),
      files: o.files ?? {},
    }),
  );
  fake.mainTerminated(pod, o.exit ?? 0);
}

describe('service on the kubernetes runtime', () => {
  it('job types come from JobType resources and follow changes without a restart', async () => {
    const list = (await (await svc.get('/job-types')).json()) as J[];
    expect(list.map((j) => j.name).sort()).toEqual(['analytics', 'default']);
    expect(list.find((j) => j.name === 'analytics')).toMatchObject({ memory_limit: '1g', cpu_limit: 2, image_exists: true });
    fake.upsertJobType('sandpod', 'ml', { pythonVersion: '3.11', memoryLimit: '2g', cpuLimit: 1, timeout: 30 });
    for (let i = 0; i < 50 && (await svc.get('/job-types/ml')).status !== 200; i++) await new Promise((r) => setTimeout(r, 50));
    expect((await svc.get('/job-types/ml')).status).toBe(200);
  });

  it('an async job runs as a Job and its record matches the local runtime\'s', async () => {
    const id = await submit(svc, { code: 'print("hi")', input_data: { a: 1 } });
    const pod = await fake.waitForPod(jobNameFor(id));
    const job = fake.get('jobs', 'sandpod-jobs', jobNameFor(id))!;
    expect((job.metadata.labels as Record<string, string>)['sandpod.io/execution-id']).toBe(id);
    await succeed(pod, { stdout: 'hi\n', result: '{"ok": true}', files: { 'plot.png': 'PNG' } });
    const rec = (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=10&view=full`)).json()) as J;
    expect(rec).toMatchObject({ status: 'succeeded', exit_code: 0, stdout: 'hi\n', output: { ok: true }, error: null, job_type: 'default' });
    expect(rec.artifacts.map((a: J) => a.name)).toEqual(['plot.png']);
    expect(rec.timing.phase_at_exit).toBe('completed');
    const art = await svc.get(`/jobs/${id}/artifacts/plot.png`);
    expect(await art.text()).toBe('PNG');
  });

  it('sync /execute waits for the pod and answers the SPEC §2.2 body', async () => {
    const pending = svc.post('/execute', { code: 'raise ValueError("x")' });
    let pod: string | undefined;
    for (let i = 0; i < 100 && !pod; i++) {
      pod = fake.list('pods', 'sandpod-jobs').map((p) => p.metadata.name).find((n) => !fake.get('pods', 'sandpod-jobs', n)!.status?.phase || fake.get('pods', 'sandpod-jobs', n)!.status?.phase === 'Pending');
      if (!pod) await new Promise((r) => setTimeout(r, 50));
    }
    await succeed(pod!, { exit: 1, report: { exit_code: 1, exception: 'ValueError', exception_mro: ['ValueError', 'Exception'], exception_message: 'x' } });
    const body = (await (await pending).json()) as J;
    expect(body).toMatchObject({ success: false, exit_code: 1, error: { type: 'value_error' } });
  });

  it('streams the runner cut at max_stdout_bytes are flagged in the record, as on the local runtime (issue #9)', async () => {
    const id = await submit(svc, { code: 'print("x" * 10**8)' });
    const pod = await fake.waitForPod(jobNameFor(id));
    await succeed(pod, { stdout: 'xxxx', report: { exit_code: 0, timed_out: false, execution_ms: 3, stdout_truncated: true, stderr_truncated: false } });
    const rec = (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=10&view=full`)).json()) as J;
    expect(rec).toMatchObject({ status: 'succeeded', stdout: 'xxxx', stdout_truncated: true, stderr_truncated: false });
  });

  it('OOMKilled → status oom, exit 137', async () => {
    const id = await submit(svc, { code: 'x = bytearray(10**10)' });
    const pod = await fake.waitForPod(jobNameFor(id));
    fake.schedule(pod);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ phase: 'execution', stdout: '', stderr: '', report: {} }));
    fake.terminated(pod, 'main', 137, 'OOMKilled');
    const rec = (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=10`)).json()) as J;
    expect(rec).toMatchObject({ status: 'oom', exit_code: 137, error: { type: 'oom' } });
  });

  it('cancel deletes the Job and records cancelled', async () => {
    const id = await submit(svc, { code: 'import time; time.sleep(100)' });
    const pod = await fake.waitForPod(jobNameFor(id));
    fake.schedule(pod);
    fake.mainRunning(pod);
    for (let i = 0; i < 50 && ((await (await svc.get(`/jobs/${id}`)).json()) as J).status !== 'running'; i++) await new Promise((r) => setTimeout(r, 50));
    const res = await svc.post(`/jobs/${id}/cancel`);
    expect(await res.json()).toMatchObject({ status: 'cancelled' });
    await fake.waitFor(() => fake.get('jobs', 'sandpod-jobs', jobNameFor(id)) === undefined, 5000, 'job deleted');
  });

  it('a service restart re-attaches to the running Job and finishes the record', async () => {
    const id = await submit(svc, { code: 'print("survivor")' });
    const pod = await fake.waitForPod(jobNameFor(id));
    fake.schedule(pod);
    fake.mainRunning(pod);
    for (let i = 0; i < 50 && ((await (await svc.get(`/jobs/${id}`)).json()) as J).status !== 'running'; i++) await new Promise((r) => setTimeout(r, 50));
    // Crash: the process's database and runtime vanish without finalizing anything. The database
    // goes first: a stopped runtime rejects the run, and the dying service's retry could otherwise
    // still write a verdict (internal_error) before its database is gone.
    await svc.db.destroy();
    await svc.runtime.stop();
    const next = await startTestService(K8S, {}, database);
    try {
      await succeed(pod, { stdout: 'survivor\n' });
      const rec = (await (await next.get(`/jobs/${id}/result?wait=true&timeout=10`)).json()) as J;
      expect(rec).toMatchObject({ status: 'succeeded', stdout: 'survivor\n' });
      expect(fake.list('jobs', 'sandpod-jobs').filter((j) => j.metadata.name === jobNameFor(id))).toHaveLength(1);
    } finally {
      await next.close();
    }
  });
});

describe('service on the kubernetes runtime: a stop with runs in flight', () => {
  it('an async run still running when the grace ends keeps its pod and goes back to the queue; the next holder re-attaches, the program runs once', async () => {
    // A replica deleted mid-run (SIGTERM, its grace over) must not delete a pod whose program runs:
    // the run would start again in a new pod, its program twice.
    const own = await freshDatabase();
    const first = await startTestService(K8S, {}, own);
    let next: TestService | undefined;
    try {
      const id = await submit(first, { code: 'print("handed back")' });
      const job = jobNameFor(id);
      const pod = await fake.waitForPod(job);
      fake.schedule(pod);
      fake.mainRunning(pod);
      for (let i = 0; i < 100 && ((await (await first.get(`/jobs/${id}`)).json()) as J).phase !== 'execution'; i++) await new Promise((r) => setTimeout(r, 50));
      const jobUid = fake.get('jobs', 'sandpod-jobs', job)!.metadata.uid;
      await first.stop(200);
      expect(fake.get('jobs', 'sandpod-jobs', job)?.metadata.deletionTimestamp).toBeUndefined();
      expect(fake.get('pods', 'sandpod-jobs', pod)?.metadata.deletionTimestamp).toBeUndefined();
      next = await startTestService(K8S, {}, own);
      expect((((await (await next.get(`/jobs/${id}`)).json()) as J).status as string)).toMatch(/^(queued|running)$/);
      await new Promise((r) => setTimeout(r, 500));
      await succeed(pod, { stdout: 'handed back\n' });
      const rec = (await (await next.get(`/jobs/${id}/result?wait=true&timeout=10`)).json()) as J;
      expect(rec).toMatchObject({ status: 'succeeded', stdout: 'handed back\n' });
      // The same Job and pod: nothing was started again.
      expect(fake.list('jobs', 'sandpod-jobs').filter((j) => j.metadata.name === job).map((j) => j.metadata.uid)).toEqual([jobUid]);
      expect(fake.list('pods', 'sandpod-jobs').filter((p) => p.metadata.labels?.['job-name'] === job).map((p) => p.metadata.name)).toEqual([pod]);
    } finally {
      await next?.close();
      await own.drop();
    }
  });
});
