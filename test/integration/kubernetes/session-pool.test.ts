/**
 * The Kubernetes session pool (issue 19: "a sandbox, from the warm pool when one is ready, becomes this
 * session's") against the fake API server, whose session pods run the real runner and session collector:
 * a session opened while a pooled pod is ready gets that very pod (`warm`, its Job `sps-p-…` labelled
 * with the session id, its deadline the session's), state and files work there; a conflict on the pod's
 * label is retried, a claimed pod that is gone sends the session to a cold start; two concurrent opens
 * never share one; the pool refills after a take and its stats count hits and misses; a second runtime
 * instance adopts a pool-claimed session (the same pod, the state kept) and its close deletes that Job;
 * an unclaimed pooled pod is never adopted as a session nor swept by the leader's sweeps, while the
 * pool-claimed Job of an ended session is; allowed_hosts types behind the egress proxy are not pooled.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Config } from '../../../src/config.ts';
import { createKubernetesRuntime } from '../../../src/runtime/kubernetes/index.ts';
import { SESSION_LABELS } from '../../../src/runtime/kubernetes/session/session-job.ts';
import { SESSION_POOL_LABELS } from '../../../src/runtime/kubernetes/session/session-pool-plan.ts';
import type { Runtime } from '../../../src/runtime/runtime.ts';
import type { SessionSandbox } from '../../../src/runtime/session.ts';
import { FAST_TUNING, FakeKube, jobType, testConfig } from '../../support/kube-runtime.ts';

type J = Record<string, any>;
const NS = 'sandpod-jobs';
const JT = jobType();
let fake: FakeKube;
const runtimes: Runtime[] = [];
/** Session ids the leader's sweep counts as live. */
const live = new Set<string>();

const start = async (config: Config): Promise<Runtime> => {
  const rt = createKubernetesRuntime(config, {
    kubeConfig: fake.kubeConfig(),
    jobTypes: () => [JT],
    hooks: { liveExecutionIds: async () => new Set(), liveSessionIds: async (ids) => new Set(ids.filter((id) => live.has(id))) },
    tuning: { ...FAST_TUNING, poolIntervalMs: 150, sweepIntervalMs: 200 },
  });
  await rt.start();
  runtimes.push(rt);
  return rt;
};
const stopAll = async () => {
  for (const rt of runtimes.splice(0)) await rt.stop();
};
const open = (rt: Runtime, sessionId = randomUUID()) => rt.openSession!(JT, { maxStreamBytes: 65536, startupMs: 20_000, sessionId, lifetimeSec: 600 });
const pooledJobs = () => fake.list('jobs', NS).filter((j) => j.metadata.labels?.[SESSION_POOL_LABELS.pool] && !j.metadata.deletionTimestamp);
const unclaimed = () => pooledJobs().filter((j) => !j.metadata.labels?.[SESSION_LABELS.sessionId]);
const podOfJob = (job: string) => fake.list('pods', NS).find((p) => p.metadata.labels?.['job-name'] === job && !p.metadata.deletionTimestamp);
const isReady = (job: string) => {
  const p = podOfJob(job);
  return ['main', 'collector'].every((c) => p?.status?.containerStatuses?.find((s: J) => s.name === c)?.state?.running);
};
const readyUnclaimed = () => unclaimed().filter((j) => isReady(j.metadata.name)).map((j) => j.metadata.name as string);
/** Until `n` pooled pods are ready in the cluster and in the runtime's informer (its stats). */
const waitReady = (rt: Runtime, n: number) =>
  fake.waitFor(() => readyUnclaimed().length >= n && (rt.sessionPoolStats!().find((s) => s.job_type === 'default')?.ready ?? 0) >= n, 20_000, `${n} ready pooled session pods`);
const cell = (s: SessionSandbox, n: number, code: string) => s.runCell({ cell: n, code, inputJson: '{}', timeoutSec: 10, maxStdoutBytes: 65536, maxArtifactBytes: 1 << 20 });

// A cluster of its own per test: pooled Jobs a test left are no other test's.
beforeEach(async () => {
  fake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
  fake.addRuntimeClass('gvisor');
}, 60_000);

afterEach(async () => {
  await stopAll();
  live.clear();
  await fake?.close();
});

describe('the session pool on the Kubernetes runtime (fake API server, real runner and collector)', () => {
  it('a session takes the ready pooled pod: warm, that very pod, state and files; the pool refills; stats count the hit', async () => {
    const rt = await start(testConfig({ warm_pool: { session_sizes: { default: 1 } } }));
    await waitReady(rt, 1);
    const [pooled] = readyUnclaimed();
    const pooledPod = podOfJob(pooled!)!.metadata.name;
    expect(pooled).toMatch(/^sps-p-[0-9a-f]{12}$/);
    // Ready and unclaimed: labelled as the pool's, no session's.
    expect(podOfJob(pooled!)!.metadata.labels?.[SESSION_LABELS.sessionId]).toBeUndefined();
    const id = randomUUID();
    live.add(id);
    const s = (await open(rt, id)) as SessionSandbox & { jobName: string; podName: string };
    expect(s.warm).toBe(true);
    expect(s.jobName).toBe(pooled);
    expect(s.podName).toBe(pooledPod);
    const job = fake.list('jobs', NS).find((j) => j.metadata.name === pooled)!;
    expect(job.metadata.labels?.[SESSION_LABELS.sessionId]).toBe(id);
    expect(podOfJob(pooled!)!.metadata.labels?.[SESSION_LABELS.sessionId]).toBe(id);
    // The deadline is the session's now (lifetime 600 s + slack), no longer the pool's day.
    expect(job.spec.activeDeadlineSeconds).toBeGreaterThanOrEqual(600);
    expect(job.spec.activeDeadlineSeconds).toBeLessThan(1200);
    expect(await cell(s, 1, 'x = 20\nopen("f.txt", "w").write("w")')).toMatchObject({ report: { exit_code: 0 } });
    expect((await cell(s, 2, 'print(x + 1, open("f.txt").read())')).stdout).toBe('21 w\n');
    expect((await s.files!.list()).map((f) => f.name)).toEqual(['f.txt']);
    await s.files!.write('in.csv', Buffer.from('a,b\n'), 1 << 20);
    expect((await cell(s, 3, 'print(open("in.csv").read().strip())')).stdout).toBe('a,b\n');
    // Refill: a new pooled pod, ready, other than the taken one.
    await fake.waitFor(() => readyUnclaimed().some((n) => n !== pooled), 20_000, 'the pool refilled');
    expect(rt.sessionPoolStats!()).toEqual([expect.objectContaining({ job_type: 'default', target: 1, ready: 1, hits: 1, misses: 0 })]);
    await s.destroy();
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === pooled), 5000, 'the claimed Job deleted on close');
    live.delete(id);
    await stopAll();
  }, 90_000);

  it("a conflict on the pod's label (its status moved on) is read again and retried; a claimed Job whose pod is gone is deleted and the session starts its own", async () => {
    const rt = await start(testConfig({ warm_pool: { session_sizes: { default: 1 } } }));
    await waitReady(rt, 1);
    const [pooled] = readyUnclaimed();
    const pod = podOfJob(pooled!)!.metadata.name as string;
    fake.failNext(new RegExp(`/pods/${pod}$`), 409, 1, 'PATCH');
    const from = fake.apiCalls().length;
    const id = randomUUID();
    live.add(id);
    const s = (await open(rt, id)) as SessionSandbox & { podName: string };
    expect(s.warm).toBe(true);
    expect(s.podName).toBe(pod);
    expect(podOfJob(pooled!)!.metadata.labels?.[SESSION_LABELS.sessionId]).toBe(id);
    const calls = fake.apiCalls(from).filter((c) => c.path.endsWith(`/pods/${pod}`)).map((c) => c.method);
    expect(calls).toEqual(['PATCH', 'GET', 'PATCH']);
    await s.destroy();
    // The next ready one's pod vanishes at the claim: the patch finds it gone (404).
    await waitReady(rt, 1);
    const [next] = readyUnclaimed();
    const nextPod = podOfJob(next!)!.metadata.name as string;
    fake.failNext(new RegExp(`/pods/${nextPod}$`), 404, 2);
    const id2 = randomUUID();
    live.add(id2);
    const cold = (await open(rt, id2)) as SessionSandbox & { jobName: string };
    expect(cold.warm).toBeFalsy();
    expect(cold.jobName).not.toBe(next);
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === next && !j.metadata.deletionTimestamp), 5000, 'the useless claimed Job deleted');
    await cold.destroy();
  }, 90_000);

  it('two concurrent opens never share a pod: with one ready, one is warm and one starts its own', async () => {
    const rt = await start(testConfig({ warm_pool: { session_sizes: { default: 1 } } }));
    await waitReady(rt, 1);
    const ids = [randomUUID(), randomUUID()];
    for (const id of ids) live.add(id);
    const [a, b] = (await Promise.all(ids.map((id) => open(rt, id)))) as (SessionSandbox & { podName: string; jobName: string })[];
    expect(a!.podName).not.toBe(b!.podName);
    expect([a!.warm, b!.warm].sort()).toEqual([false, true]);
    const cold = a!.warm ? b! : a!;
    expect(cold.jobName).toMatch(/^sps-[0-9a-f]{8}-/);
    expect(await cell(a!, 1, 'v = "a"')).toMatchObject({ report: { exit_code: 0 } });
    expect((await cell(b!, 1, 'print("v" in globals())')).stdout).toBe('False\n');
    const stats = rt.sessionPoolStats!()[0]!;
    expect(stats.hits + stats.misses).toBeGreaterThanOrEqual(2);
    expect(stats.misses).toBeGreaterThanOrEqual(1);
    await a!.destroy();
    await b!.destroy();
    for (const id of ids) live.delete(id);
    await stopAll();
  }, 90_000);

  it('two ready: concurrent opens take both, each its own; surplus is never handed twice', async () => {
    const rt = await start(testConfig({ warm_pool: { session_sizes: { default: 2 } } }));
    await waitReady(rt, 2);
    const ids = [randomUUID(), randomUUID(), randomUUID()];
    for (const id of ids) live.add(id);
    const got = (await Promise.all(ids.map((id) => open(rt, id)))) as (SessionSandbox & { podName: string })[];
    expect(new Set(got.map((s) => s.podName)).size).toBe(3);
    expect(got.filter((s) => s.warm)).toHaveLength(2);
    for (const s of got) await s.destroy();
    for (const id of ids) live.delete(id);
    await stopAll();
  }, 90_000);

  it('a second runtime instance adopts a pool-claimed session; unclaimed pooled pods are neither adopted nor swept; an ended one is swept by its Job name', async () => {
    const config = testConfig({ warm_pool: { session_sizes: { default: 2 } } });
    const a = await start(config);
    await waitReady(a, 2);
    const id = randomUUID();
    live.add(id);
    const s = (await open(a, id)) as SessionSandbox & { podName: string; jobName: string };
    expect(s.warm).toBe(true);
    expect(await cell(s, 1, 'kept = 41\nopen("k.txt", "w").write("k")')).toMatchObject({ report: { exit_code: 0 } });
    s.release!();
    await stopAll();
    const b = await start(config);
    await waitReady(b, 2);
    const before = readyUnclaimed().sort();
    // An unclaimed pooled pod is no session's: adopting an unknown id finds nothing and removes nothing.
    expect(await b.adoptSession!(randomUUID())).toBeNull();
    const adopted = (await b.adoptSession!(id)) as SessionSandbox & { podName: string; jobName: string };
    expect(adopted).not.toBeNull();
    expect(adopted.podName).toBe(s.podName);
    expect(adopted.jobName).toBe(s.jobName);
    expect(adopted.warm).toBe(true);
    expect((await cell(adopted, 2, 'print(kept + 1, open("k.txt").read())')).stdout).toBe('42 k\n');
    // Several sweeps of the new leader (every 200 ms): the pooled, unclaimed Jobs are still there.
    await new Promise((r) => setTimeout(r, 1200));
    expect(readyUnclaimed().sort()).toEqual(before);
    // The session ends while its Job's delete fails: the leader's sweep removes it by its (pool) name.
    fake.failNext(new RegExp(`/jobs/${s.jobName}$`), 500, 1, 'DELETE');
    await adopted.destroy();
    expect(fake.list('jobs', NS).some((j) => j.metadata.name === s.jobName)).toBe(true);
    live.delete(id);
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === s.jobName), 5000, 'the ended session Job swept');
    expect(unclaimed().map((j) => j.metadata.name)).toEqual(expect.arrayContaining(before));
    await stopAll();
  }, 120_000);

  it('a pool of zero: sessions start cold and count as misses; the demand floor then keeps one ready', async () => {
    const rt = await start(testConfig({ warm_pool: { session_sizes: {} } }));
    await new Promise((r) => setTimeout(r, 600));
    expect(pooledJobs()).toEqual([]);
    const id = randomUUID();
    live.add(id);
    const s = await open(rt, id);
    expect(s.warm).toBeFalsy();
    await fake.waitFor(() => readyUnclaimed().length === 1, 20_000, 'the demand floor keeps one ready');
    expect(rt.sessionPoolStats!()).toEqual([expect.objectContaining({ job_type: 'default', target: 1, misses: 1, hits: 0 })]);
    await s.destroy();
    live.delete(id);
    await stopAll();
  }, 90_000);

  it('allowed_hosts types behind the egress proxy are not pooled', async () => {
    const proxied = jobType({ name: 'web', network: { mode: 'bridge', allowed_hosts: ['example.com'] } });
    const config = testConfig({ warm_pool: { session_sizes: { default: 0, web: 2 } }, kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, egress_proxy: { url: 'http://egress.example:3128', key_file: '/nonexistent' } } });
    const rt = createKubernetesRuntime(config, { kubeConfig: fake.kubeConfig(), jobTypes: () => [proxied], tuning: { ...FAST_TUNING, poolIntervalMs: 100 } });
    await rt.start();
    runtimes.push(rt);
    await new Promise((r) => setTimeout(r, 800));
    expect(pooledJobs().filter((j) => j.metadata.labels?.[SESSION_POOL_LABELS.pool] === 'web')).toEqual([]);
    expect(rt.sessionPoolStats!().filter((s) => s.job_type === 'web' && s.target > 0)).toEqual([]);
    await stopAll();
  }, 30_000);
});
