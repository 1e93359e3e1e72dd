/**
 * Fault: the Kubernetes API answering 500s, timing out, hanging and closing watches for a while
 * (issue #9 §6), against the in-repo fake API server through the whole service (main.ts wiring,
 * KUBECONFIG → the fake). Injected with the fake's own fault API: `failNext` (500s; 504 after the
 * write was stored, as a server that times out after etcd committed), `setDown` (every request 503),
 * `closeWatches` + `compact` (watches dropped, history gone), `hang` (requests accepted and never
 * answered, watches open and silent past their timeoutSeconds). The breaker follows SPEC §3 with its
 * default numbers: 5 consecutive failures open it, 30 s later (an injected clock) it is half-open,
 * 2 successes close it. Every accepted job ends recorded; no 5xx but the documented 503s.
 *
 * The client layer's own deadlines are tested first, against a fake of their own: a call, an exec
 * upgrade and a watch's headers that never come, and a watch that stays open silent.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { V1Job } from '@kubernetes/client-node';
import { KubeApi, KubeTimeoutError, ReconnectingInformer, watchDeadlineMs } from '../../../src/kube/index.ts';
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
      // Short deadlines so a hang is seen in seconds: calls give up after 1 s, watches are closed by
      // the server after 1 s and taken as stalled 2 s after they opened.
      kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, api_timeout_seconds: 1, watch_timeout_seconds: 1, preflight: false },
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
async function succeedPod(id: string, stdout: string, podTimeoutMs?: number): Promise<void> {
  const pod = await fake.waitForPod(jobNameFor(id), podTimeoutMs);
  fake.schedule(pod);
  fake.mainRunning(pod);
  fake.setOutput(pod, await outputTar({ stdout, report: { exit_code: 0, execution_ms: 1 } }));
  fake.mainTerminated(pod, 0);
}

async function result(id: string): Promise<J> {
  return (await call('GET', `/jobs/${id}/result?wait=true&timeout=15`)).body;
}

const breaker = () => svc.breaker.snapshot();

/** Waits until the breaker is open (the dispatcher retries requeued jobs until then). */
async function breakerOpens(ms = 20_000): Promise<void> {
  const until = Date.now() + ms;
  while (breaker().state !== 'open') {
    if (Date.now() > until) throw new Error(`the breaker did not open: ${JSON.stringify(breaker())}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Jobs the machinery failed before their code started wait in the queue (issue 22 item 4), none failed. */
async function stillQueued(ids: string[]): Promise<void> {
  for (const id of ids) expect(['queued', 'running']).toContain((await call('GET', `/jobs/${id}`)).body.status);
  const rows = await svc.db.kysely.selectFrom('executions').select(['infra_failures']).where('id', 'in', ids).execute();
  expect(rows.some((r) => r.infra_failures > 0)).toBe(true);
}

const NS = 'sandpod-jobs';

describe('the client layer against a hung API server', () => {
  let hung: FakeKube;
  let api: KubeApi;
  beforeAll(async () => {
    hung = await FakeKube.start();
    api = new KubeApi(hung.kubeConfig(), { requestTimeoutMs: 300 });
  });
  afterAll(async () => {
    await hung?.close();
  });
  const job = (name: string): V1Job => ({
    metadata: { name, namespace: NS },
    spec: { template: { spec: { restartPolicy: 'Never', containers: [{ name: 'main', image: 'x' }, { name: 'collector', image: 'x' }] } } },
  });

  it('a call that is never answered fails within its deadline, and is not carried out once its client gave up', async () => {
    hung.hang({ path: /\/jobs$/, method: 'POST' });
    faults++;
    const t0 = Date.now();
    const err = await api.createJob(job('hang-create')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KubeTimeoutError);
    expect(String(err)).toMatch(/create job: no answer from the Kubernetes API within 300 ms/);
    expect(Date.now() - t0).toBeLessThan(2000);
    // The request reached the server and is held there (its client is gone)...
    expect(hung.requests.some((r) => r.method === 'POST' && r.path.endsWith('/jobs'))).toBe(true);
    await hung.waitFor(() => hung.hungRequests === 0, 2000, 'the abandoned request to be seen as gone');
    hung.clearHang();
    // ...and, as a real server cancels a request whose client went away, never carried out.
    await new Promise((r) => setTimeout(r, 50));
    expect(hung.get('jobs', NS, 'hang-create')).toBeUndefined();
    // Other verbs were never affected; after the hang the same call works.
    expect(await api.createJob(job('hang-create'))).toMatchObject({ metadata: { name: 'hang-create' } });
  });

  it('a held request whose client still waits is answered when the hang clears (the fake, as a slow server)', async () => {
    hung.hang({ path: /\/jobs$/, method: 'GET' });
    const res = fetch(`${hung.url}/apis/batch/v1/namespaces/${NS}/jobs`);
    let settled = false;
    void res.then(() => (settled = true));
    await hung.waitFor(() => hung.hungRequests === 1, 2000, 'the request to be held');
    await new Promise((r) => setTimeout(r, 200));
    expect(settled).toBe(false);
    hung.clearHang();
    const answer = await res;
    expect(answer.status).toBe(200);
    expect(((await answer.json()) as { items: unknown[] }).items.length).toBeGreaterThanOrEqual(1);
  });

  it('an exec upgrade that is never answered fails within the request deadline, not the exec\'s own', async () => {
    await api.createJob(job('hang-exec'));
    const pod = await hung.waitForPod('hang-exec');
    hung.mainRunning(pod);
    hung.hang({ path: /\/exec$/ });
    faults++;
    const t0 = Date.now();
    const err = await api.exec(NS, pod, 'collector', ['tar', 'cf', '-', '-C', '/output', '.'], { timeoutMs: 20_000 }).catch((e: unknown) => e);
    expect(String(err)).toMatch(/did not answer the upgrade within 300 ms/);
    expect(Date.now() - t0).toBeLessThan(2000);
    hung.clearHang();
    expect((await api.exec(NS, pod, 'collector', ['tar', 'cf', '-', '-C', '/output', '.'])).exitCode).toBe(0);
  });

  it('the fake closes a watch at its timeoutSeconds, as a real server does; a hung one stays open and silent past it', async () => {
    const watchFor = async () => {
      const t0 = Date.now();
      const res = await fetch(`${hung.url}/apis/batch/v1/namespaces/${NS}/jobs?watch=true&timeoutSeconds=1`);
      expect(res.status).toBe(200);
      return { res, t0 };
    };
    // Healthy: the stream ends cleanly after about 1 s.
    const ok = await watchFor();
    await ok.res.text();
    expect(Date.now() - ok.t0).toBeGreaterThanOrEqual(900);
    expect(Date.now() - ok.t0).toBeLessThan(3000);
    // Hung: headers came, then nothing, and no close at the timeout.
    hung.hang({ only: 'watches' });
    const stuck = await watchFor();
    const reader = stuck.res.body!.getReader();
    const pending = reader.read();
    const first = await Promise.race([pending.then(() => 'data-or-end'), new Promise((r) => setTimeout(() => r('silent'), 1800))]);
    expect(first).toBe('silent');
    expect(hung.stalledWatches).toBe(1);
    // An event while it hangs is held, and delivered when it clears; then the watch closes (its time is past).
    await api.createJob(job('during-stall'));
    hung.clearHang();
    let text = '';
    for (let next = pending; ; next = reader.read()) {
      const { value, done } = await next;
      if (done) break;
      text += Buffer.from(value).toString('utf8');
    }
    expect(text).toContain('"during-stall"');
  });

  it('an informer whose watch stalls gives it up past its deadline and re-lists: nothing that happened meanwhile is missed', async () => {
    const informer = new ReconnectingInformer<V1Job>({
      kubeConfig: hung.kubeConfig(),
      name: 'jobs',
      path: `/apis/batch/v1/namespaces/${NS}/jobs`,
      list: () => api.listJobs(NS, ''),
      watchTimeoutSeconds: 1,
      requestTimeoutMs: 300,
      backoffInitialMs: 20,
      backoffMaxMs: 200,
    });
    await informer.start();
    try {
      await hung.waitFor(() => hung.openWatches >= 1, 2000, 'the watch');
      hung.hang({ only: 'watches' });
      faults++;
      const lists = informer.stats.lists;
      const t0 = Date.now();
      await api.createJob(job('seen-by-relist'));
      await hung.waitFor(() => informer.get('seen-by-relist') !== undefined, 3 * watchDeadlineMs(1), 'the informer to re-list');
      // Seen through a list, not the (silent) watch, and only after the watch's deadline.
      expect(informer.stats.stalls).toBeGreaterThanOrEqual(1);
      expect(informer.stats.lists).toBeGreaterThan(lists);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(500);
      // Headers that never come: the watch gives up at the request deadline and reconnects.
      hung.clearHang();
      hung.hang({ only: 'watches', watches: 'unanswered' });
      const reconnects = informer.stats.reconnects;
      await hung.waitFor(() => informer.stats.reconnects > reconnects, 3000, 'a watch whose headers never came to be retried');
      hung.clearHang();
      // Recovered: a change is heard through the watch again.
      await api.createJob(job('after-hang'));
      await hung.waitFor(() => informer.get('after-hang') !== undefined, 5000, 'the informer to follow again');
    } finally {
      informer.stop();
      hung.clearHang();
    }
  }, 20_000);
});

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

  it('an outage (every request 503): 5 consecutive failures open the breaker, the jobs wait in the queue; 30 s later it is half-open, they run, 2 successes close it', async () => {
    expect(breaker()).toMatchObject({ state: 'closed', failure_count: 0 });
    fake.setDown(true);
    fake.closeWatches();
    faults += 2;
    // Each run makes 2 attempts, each a breaker failure; a failed job goes back to the queue and is
    // tried again after a backoff, until the 5th failure opens the breaker.
    const down: string[] = [];
    for (let i = 0; i < 3; i++) down.push(await submit(`print("down ${i}")`));
    await breakerOpens();
    await stillQueued(down);
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
    // Half-open, the dispatcher lets one job at a time through, oldest first: the jobs that waited.
    await succeedPod(down[0]!, 'down 0\n', 15_000);
    expect(await result(down[0]!)).toMatchObject({ status: 'succeeded', stdout: 'down 0\n' });
    expect(breaker().state).toBe('half_open');
    await succeedPod(down[1]!, 'down 1\n', 15_000);
    expect(await result(down[1]!)).toMatchObject({ status: 'succeeded', stdout: 'down 1\n' });
    expect(breaker()).toMatchObject({ state: 'closed' });
    await succeedPod(down[2]!, 'down 2\n', 15_000);
    expect(await result(down[2]!)).toMatchObject({ status: 'succeeded', stdout: 'down 2\n' });
    await fake.waitFor(() => fake.openWatches >= 2, 10_000, 'watches resumed after the outage');
  }, 60_000);


  it('watches stall (open, silent, past their timeoutSeconds) while calls work: a run submitted meanwhile completes, the breaker stays closed', async () => {
    await fake.waitFor(() => fake.openWatches >= 2, 5000, 'watches open');
    const lists = fake.apiCalls().filter((r) => r.method === 'GET' && r.path.endsWith('/pods')).length;
    fake.hang({ only: 'watches' });
    faults++;
    try {
      expect(fake.stalledWatches).toBeGreaterThanOrEqual(2);
      const id = await submit('print("past a silent watch")');
      await succeedPod(id, 'past a silent watch\n');
      // The run's pod events never come through a watch: each step is seen by a re-list.
      expect(await result(id)).toMatchObject({ status: 'succeeded', stdout: 'past a silent watch\n' });
      expect(fake.apiCalls().filter((r) => r.method === 'GET' && r.path.endsWith('/pods')).length).toBeGreaterThan(lists);
      expect(breaker()).toMatchObject({ state: 'closed' });
    } finally {
      fake.clearHang();
    }
  }, 30_000);

  it('exec upgrades hang while a finished run is being collected, past the collection attempts: its outputs are kept once the API answers', async () => {
    const id = await submit('print("collected late")');
    const pod = await fake.waitForPod(jobNameFor(id));
    const execsBefore = fake.requests.filter((r) => r.path.endsWith('/exec')).length;
    fake.hang({ path: /\/exec$/ });
    faults++;
    try {
      await succeedPod(id, 'collected late\n');
      // Every collection attempt gets no answer to its upgrade (1 s each, then the work queue's backoff):
      // wait until more than the 3 attempts a failing collector is given have been made.
      await fake.waitFor(() => fake.requests.filter((r) => r.path.endsWith('/exec')).length - execsBefore > 4, 20_000, 'collection attempts');
      expect((await call('GET', `/jobs/${id}`)).body.status).toBe('running');
    } finally {
      fake.clearHang();
    }
    expect(pod).toBeTruthy();
    expect(await result(id)).toMatchObject({ status: 'succeeded', stdout: 'collected late\n' });
  }, 40_000);

  it('the API hangs (calls, exec, watches): the breaker opens, a run in flight completes after recovery, runs submitted during the hang end recorded, the breaker closes', async () => {
    expect(breaker()).toMatchObject({ state: 'closed' });
    // A run in flight: its pod runs when the API starts hanging, and finishes during the hang.
    const inFlight = await submit('print("in flight")');
    const pod = await fake.waitForPod(jobNameFor(inFlight));
    fake.schedule(pod);
    fake.mainRunning(pod);
    // In flight means created: its Secret (made after the Job) exists, the watches are open.
    const ownedByRun = (o: { metadata: { ownerReferences?: { name: string }[] } }) => o.metadata.ownerReferences?.some((r) => r.name === jobNameFor(inFlight));
    await fake.waitFor(() => fake.list('secrets', 'sandpod-jobs').some(ownedByRun), 5000, 'the run to be created');
    await fake.waitFor(() => fake.openWatches >= 2, 5000, 'watches open');
    fake.hang();
    faults++;
    fake.setOutput(pod, await outputTar({ stdout: 'in flight\n', report: { exit_code: 0, execution_ms: 1 } }));
    fake.mainTerminated(pod, 0);

    // Runs submitted during the hang: each attempt's first call times out (1 s) and counts once;
    // 2 attempts a run, so the 5th failure (third run) opens the breaker.
    const during: string[] = [];
    for (let i = 0; i < 3; i++) during.push(await submit(`print("during ${i}")`));
    await breakerOpens();
    await stillQueued(during);
    const sync = await call('POST', '/execute', { code: 'print(1)' });
    expect(sync.status).toBe(503);
    expect(sync.body).toMatchObject({ code: 'service_unavailable', error: { type: 'service_unavailable' } });
    // Health asks the API, which does not answer: degraded (the documented 503), within its deadline.
    const health = await call('GET', '/health');
    expect(health.body.circuit_breaker.state).toBe('open');
    // The run in flight is neither lost nor failed while the API hangs.
    expect((await call('GET', `/jobs/${inFlight}`)).body.status).toBe('running');

    // The API recovers. The creates it held were abandoned by their clients: none is carried out.
    fake.clearHang();
    await new Promise((r) => setTimeout(r, 100));
    for (const id of during) expect(fake.get('jobs', 'sandpod-jobs', jobNameFor(id))).toBeUndefined();
    // The run in flight is picked up by the informers' re-lists and completes.
    let done: J = {};
    for (const until = Date.now() + 45_000; Date.now() < until; ) {
      done = (await call('GET', `/jobs/${inFlight}/result?wait=true&timeout=5`)).body;
      if (done.status !== 'running' && done.status !== 'queued') break;
    }
    expect(done).toMatchObject({ status: 'succeeded', stdout: 'in flight\n' });

    // SPEC §3: 30 s after opening it is half-open; 2 successes close it.
    offset += 31_000;
    expect(breaker().state).toBe('half_open');
    // The jobs submitted during the hang waited in the queue; they run now (one at a time while
    // half-open) and their successes close the breaker.
    for (const [n, id] of during.entries()) {
      await succeedPod(id, `during ${n}\n`, 15_000);
      expect(await result(id)).toMatchObject({ status: 'succeeded', stdout: `during ${n}\n` });
    }
    expect(breaker()).toMatchObject({ state: 'closed' });
  }, 90_000);

  it('no accepted job was lost; no 5xx but the documented 503s', async () => {
    for (const id of accepted) {
      const r = await call('GET', `/jobs/${id}`);
      expect(r.body.status).toBe('succeeded');
    }
    expect(unexpected5xx).toEqual([]);
  });
});
