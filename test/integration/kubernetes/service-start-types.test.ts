/**
 * The service starts its job types before its runtime (main.ts): the Kubernetes runtime's session
 * pool sizes itself from the job types as soon as it starts, and a JobType registry that has not
 * listed yet answers only the built-in `default`. Started the other way round, the leader made a
 * pooled session pod for that built-in `default` (512m), which /pool/stats showed as ready while no
 * session could take it (its spec is not the cluster's `default`), and replaced it a moment later:
 * the first session after a start missed the pool. Against the fake API server, with the JobType
 * list held until the test lets it go.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SESSION_POOL_LABELS } from '../../../src/runtime/kubernetes/session/session-pool-plan.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube, useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const NS = 'sandpod-jobs';
let fake: FakeKube;
let database: TestDatabase;
let svc: TestService | undefined;
let restore: (() => void) | undefined;

beforeAll(async () => {
  fake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
  fake.addRuntimeClass('gvisor');
  fake.upsertJobType('sandpod', 'default', { pythonVersion: '3.11', memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
  restore = useFakeKubeconfig(fake);
  database = await freshDatabase();
}, 60_000);

afterAll(async () => {
  await svc?.close();
  await database?.drop();
  await fake?.close();
  restore?.();
});

describe('the service starts its job types before its runtime', () => {
  it('no pooled pod is made before the JobTypes are listed; the first session takes the one made from the cluster\'s default', async () => {
    fake.hang({ path: /\/jobtypes/, only: 'requests' });
    const starting = startTestService({ runtime: 'kubernetes', warm_pool: { session_sizes: { default: 1 } }, kubernetes: { executor_image: 'sandpod/executor:test', preflight: false } }, {}, database);
    await new Promise((r) => setTimeout(r, 1500));
    const jobPosts = () => fake.requests.filter((r) => r.method === 'POST' && r.path.startsWith(`/apis/batch/v1/namespaces/${NS}/jobs`)).length;
    expect(jobPosts()).toBe(0);
    fake.clearHang();
    svc = await starting;
    const pool = () => svc!.runtime.sessionPoolStats!().find((x) => x.job_type === 'default');
    await fake.waitFor(() => (pool()?.ready ?? 0) >= 1, 20_000, 'a ready pooled session pod');
    const pooled = fake.list('jobs', NS).filter((j) => j.metadata.labels?.[SESSION_POOL_LABELS.pool]);
    expect(pooled).toHaveLength(1);
    const main = pooled[0]!.spec.template.spec.containers.find((c: Record<string, any>) => c.name === 'main');
    expect(main.resources.limits.memory).toMatch(/^256(Mi|m|M)$/);
    expect(jobPosts()).toBe(1);
    const res = await svc.post('/sessions', {});
    const s = (await res.json()) as Record<string, any>;
    expect(res.status, JSON.stringify(s)).toBe(201);
    expect(s.warm).toBe(true);
    expect(pool()).toMatchObject({ hits: 1, misses: 0 });
    await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' });
  }, 60_000);
});
