/**
 * One guard policy on the Kubernetes runtime, through the service as main.ts wires it: the breaker +
 * retry goes around each run attempt and nowhere else. A failed Job create is one breaker failure and
 * one more attempt; the informers' background lists and watches never touch the breaker, so they
 * cannot reset its failure count while run calls fail.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { jobNameFor } from '../../../src/runtime/kubernetes/names.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { withRun } from '../../support/runtime-wrap.ts';

type J = Record<string, any>;
let fake: FakeKube;
let svc: TestService;
let restoreKubeconfig: (() => void) | undefined;
/** Run attempts the service made (calls of the real runtime's run()). */
let runCalls = 0;
/** The breaker's failure count each time the service's retry slept before another attempt. */
const failuresAtRetry: number[] = [];

const K8S = {
  runtime: 'kubernetes',
  retry: { attempts: 2, base_delay_ms: 1 },
  kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, watch_job_types: true, preflight: false },
};

beforeAll(async () => {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  restoreKubeconfig = useFakeKubeconfig(fake);
  svc = await startTestService(K8S, {
    sleep: async () => {
      failuresAtRetry.push(svc.breaker.snapshot().failure_count);
    },
    runtime: async (real) => {
      const rt = await real();
      return withRun(rt, (spec, opts) => {
        runCalls++;
        return rt.run(spec, opts);
      });
    },
  });
});
afterEach(() => {
  runCalls = 0;
  failuresAtRetry.length = 0;
});
afterAll(async () => {
  await svc?.close();
  await fake?.close();
  restoreKubeconfig?.();
});

async function submit(body: J): Promise<string> {
  const res = await svc.post('/execute/async', body);
  expect(res.status).toBe(202);
  return ((await res.json()) as J).job_id as string;
}

async function result(id: string): Promise<J> {
  return (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=10&view=full`)).json()) as J;
}

describe('one guard policy on the kubernetes runtime', () => {
  it('a Job create that gets a 500 then succeeds: one breaker failure, one more run attempt, the record succeeds', async () => {
    const before = fake.requests.length;
    fake.failNext(/\/jobs$/, 500, 1, 'POST');
    const id = await submit({ code: 'print("hi")' });
    const pod = await fake.waitForPod(jobNameFor(id));
    fake.schedule(pod);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stdout: 'hi\n', report: { exit_code: 0, execution_ms: 1 } }));
    fake.mainTerminated(pod, 0);
    expect(await result(id)).toMatchObject({ status: 'succeeded', stdout: 'hi\n' });
    // The runtime did not retry the create itself: the service ran a second attempt, and the
    // breaker had counted the failure exactly once when it did.
    expect(runCalls).toBe(2);
    expect(failuresAtRetry).toEqual([1]);
    expect(fake.apiCalls(before).filter((r) => r.method === 'POST' && r.path.endsWith('/jobs'))).toHaveLength(2);
    expect(svc.breaker.snapshot()).toMatchObject({ state: 'closed', failure_count: 0 });
  });

  it('informer relists (after a watch close and 410 Gone) leave the breaker failure count alone', async () => {
    // Both attempts of one run fail at the Job create: two breaker failures.
    fake.failNext(/\/jobs$/, 500, 2, 'POST');
    const id = await submit({ code: 'print("never")' });
    // The job goes back to the queue for a later try (issue 22 item 4); cancelled before that try,
    // so that only these two attempts count.
    for (const until = Date.now() + 10_000; ; ) {
      const row = await svc.db.kysely.selectFrom('executions').select(['status', 'infra_failures']).where('id', '=', id).executeTakeFirstOrThrow();
      if (row.status === 'queued' && row.infra_failures === 1) break;
      if (Date.now() > until) throw new Error(`the job was not requeued: ${JSON.stringify(row)}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    expect((await svc.post(`/jobs/${id}/cancel`)).status).toBe(200);
    expect(runCalls).toBe(2);
    expect(svc.breaker.snapshot().failure_count).toBe(2);

    // Every informer (pods, jobs, jobtypes) loses its watch and its history: each one re-lists.
    const before = fake.requests.length;
    fake.closeWatches();
    fake.upsertJobType('sandpod', 'later', {});
    fake.compact();
    const listed = () => new Set(fake.apiCalls(before).filter((r) => r.method === 'GET').map((r) => r.path.split('/').pop()));
    await fake.waitFor(() => ['pods', 'jobs', 'jobtypes'].every((k) => listed().has(k)), 5000, 'every informer re-listed');
    await fake.waitFor(() => fake.openWatches >= 3, 5000, 'watches resumed');
    expect(svc.breaker.snapshot()).toMatchObject({ state: 'closed', failure_count: 2 });
  });
});
