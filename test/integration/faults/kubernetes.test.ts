/**
 * Fault: the Kubernetes API answering 500s, timing out and closing watches for a while (issue #9
 * §6), against the in-repo fake API server through the whole service (main.ts wiring, KUBECONFIG →
 * the fake). Injected with the fake's own fault API: `failNext` (500s; 504 after the write was
 * stored, as a server that times out after etcd committed), `setDown` (every request 503),
 * `closeWatches` + `compact` (watches dropped, history gone). The breaker follows SPEC §3 with its
 * default numbers: 5 consecutive failures open it, 30 s later (an injected clock) it is half-open,
 * 2 successes close it. Every accepted job ends recorded; no 5xx but the documented 503s.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobNameFor } from '../../../src/runtime/kubernetes/names.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { outputTar } from '../../support/fake-kube/tar.ts';
import { useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
let fake: FakeKube;
let svc: TestService;
let restoreKubeconfig: (() => void) | undefined;
let offset = 0;
let faults = 0;
const accepted: string[] = [];
const unexpected5xx: string[] = [];

beforeAll(async () => {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  restoreKubeconfig = useFakeKubeconfig(fake);
  svc = await startTestService(
    {
      runtime: 'kubernetes',
      retry: { attempts: 2, base_delay_ms: 1 },
      breaker: { failure_threshold: 5, recovery_timeout_ms: 30_000, success_threshold: 2 },
      kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5 },
    },
    { now: () => Date.now() + offset, sleep: async () => {} },
  );
}, 60_000);
afterAll(async () => {
  await svc?.close();
  await fake?.close();
  restoreKubeconfig?.();
  console.info(`kubernetes faults: ${faults} injected, ${accepted.length} jobs accepted, ${unexpected5xx.length} unexpected 5xx`);
});

async function call(method: 'GET' | 'POST', p: string, body?: unknown): Promise<{ status: number; body: J }> {
  const res = method === 'POST' ? await svc.post(p, body) : await svc.get(p);
  const parsed = (await res.json()) as J;
  const documented = res.status === 503 && (parsed.code === 'service_unavailable' || (p === '/health' && parsed.status === 'degraded'));
  if (res.status >= 500 && !documented) unexpected5xx.push(`${method} ${p} → ${res.status} ${JSON.stringify(parsed)}`);
  if (p === '/execute/async' && res.status === 202) accepted.push(parsed.job_id as string);
  return { status: res.status, body: parsed };
}

async function submit(code: string): Promise<string> {
  const r = await call('POST', '/execute/async', { code });
  expect(r.status).toBe(202);
  return r.body.job_id as string;
}

/** Drives the run's pod to a clean exit printing `stdout`. */
async function succeedPod(id: string, stdout: string): Promise<void> {
  const pod = await fake.waitForPod(jobNameFor(id));
  fake.schedule(pod);
  fake.mainRunning(pod);
  fake.setOutput(pod, await outputTar({ stdout, report: { exit_code: 0, execution_ms: 1 } }));
  fake.mainTerminated(pod, 0);
}

async function result(id: string): Promise<J> {
  return (await call('GET', `/jobs/${id}/result?wait=true&timeout=15`)).body;
}

const breaker = () => svc.breaker.snapshot();

describe('Kubernetes API faults', () => {
  it('a run in flight while watches close, history is compacted and lists answer 500: it completes', async () => {
    const id = await submit('print("through")');
    const pod = await fake.waitForPod(jobNameFor(id));
    fake.schedule(pod);
    fake.mainRunning(pod);
    // The API server "restarts": every watch closes, the history is gone (410 on resume), and the
    // informers' re-lists get 500s for a while.
    fake.failNext(/\/pods$/, 500, 3, 'GET');
    fake.failNext(/\/jobs$/, 500, 3, 'GET');
    fake.closeWatches();
    fake.compact();
    faults += 3;
    fake.setOutput(pod, await outputTar({ stdout: 'through\n', report: { exit_code: 0, execution_ms: 1 } }));
    fake.mainTerminated(pod, 0);
    expect(await result(id)).toMatchObject({ status: 'succeeded', stdout: 'through\n' });
    await fake.waitFor(() => fake.openWatches >= 2, 5000, 'watches resumed');
    expect(breaker()).toMatchObject({ state: 'closed' });
  });

  it('a Job create that times out after the server stored it (504): the run completes, once', async () => {
    const before = fake.requests.length;
    fake.failNext(/\/jobs$/, 504, 1, 'POST', { afterCommit: true });
    faults++;
    const id = await submit('print("once")');
    await succeedPod(id, 'once\n');
    expect(await result(id)).toMatchObject({ status: 'succeeded', stdout: 'once\n' });
    // One Job for the run, whatever the client retried.
    expect(fake.list('jobs').filter((j) => j.metadata.name === jobNameFor(id))).toHaveLength(1);
    expect(fake.apiCalls(before).filter((r) => r.method === 'POST' && r.path.endsWith('/jobs')).length).toBeGreaterThanOrEqual(1);
  });

  it('an outage (every request 503): 5 consecutive failures open the breaker, 30 s later it is half-open, 2 successes close it', async () => {
    expect(breaker()).toMatchObject({ state: 'closed', failure_count: 0 });
    fake.setDown(true);
    fake.closeWatches();
    faults += 2;
    // Each run makes 2 attempts, each a breaker failure: 2, 4, then the 5th failure opens it.
    const failed: string[] = [];
    for (let i = 0; i < 3; i++) failed.push(await submit(`print("down ${i}")`));
    const rows = await Promise.all(failed.map(result));
    rows.forEach((r) => expect(r).toMatchObject({ status: 'failed', error: { type: expect.stringMatching(/^(internal_error|service_unavailable)$/) } }));
    expect(breaker().state).toBe('open');
    expect(breaker().failure_count).toBeGreaterThanOrEqual(5);
    // Open: a run ends at once with service_unavailable, the sync answer is the documented 503.
    const sync = await call('POST', '/execute', { code: 'print(1)' });
    expect(sync.status).toBe(503);
    expect(sync.body).toMatchObject({ code: 'service_unavailable', error: { type: 'service_unavailable' }, correlation_id: expect.any(String) });
    expect((await call('GET', '/health')).body.circuit_breaker.state).toBe('open');

    // The API comes back; before the recovery time the breaker stays open.
    fake.setDown(false);
    offset += 29_000;
    expect(breaker().state).toBe('open');
    offset += 1_500;
    expect(breaker().state).toBe('half_open');
    const a = await submit('print("back 1")');
    await succeedPod(a, 'back 1\n');
    expect(await result(a)).toMatchObject({ status: 'succeeded', stdout: 'back 1\n' });
    expect(breaker().state).toBe('half_open');
    const b = await submit('print("back 2")');
    await succeedPod(b, 'back 2\n');
    expect(await result(b)).toMatchObject({ status: 'succeeded', stdout: 'back 2\n' });
    expect(breaker()).toMatchObject({ state: 'closed' });
    await fake.waitFor(() => fake.openWatches >= 2, 10_000, 'watches resumed after the outage');
  }, 60_000);

  it('no accepted job was lost; no 5xx but the documented 503s', async () => {
    for (const id of accepted) {
      const r = await call('GET', `/jobs/${id}`);
      expect(['succeeded', 'failed']).toContain(r.body.status);
    }
    expect(unexpected5xx).toEqual([]);
  });
});
