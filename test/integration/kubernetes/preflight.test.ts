/**
 * Preflight against the in-repo fake API server (issue #13 point 5): the whole service starts, runs
 * its canary Job in the runs namespace beside the runs, and `/health` reports what the canary said —
 * degraded with the reason when threads (or select, or subprocesses) fail in the run sandbox.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { PREFLIGHT_LABEL } from '../../../src/runtime/kubernetes/checks/preflight.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
const report = (checks: Record<string, unknown>) => JSON.stringify({ sandpod_preflight: 1, checks });

let fake: FakeKube | undefined;
let database: TestDatabase | undefined;
let svc: TestService | undefined;
let restore: (() => void) | undefined;

afterEach(async () => {
  await svc?.close();
  await database?.drop();
  await fake?.close();
  restore?.();
  svc = undefined;
});

async function start(kubernetes: J = {}): Promise<TestService> {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  fake.upsertJobType('sandpod', 'default', { pythonVersion: '3.11', memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
  restore = useFakeKubeconfig(fake);
  database = await freshDatabase();
  svc = await startTestService({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, watch_job_types: true, ...kubernetes } }, {}, database);
  return svc;
}

async function canaryJob(): Promise<J> {
  let job: J | undefined;
  await fake!.waitFor(() => (job = fake!.list('jobs', 'sandpod-jobs').find((j) => j.metadata.labels?.[PREFLIGHT_LABEL] === 'preflight')) !== undefined, 10_000, 'the canary Job');
  return job!;
}

async function health(s: TestService): Promise<{ status: number; body: J }> {
  const res = await s.get('/health');
  return { status: res.status, body: (await res.json()) as J };
}

async function finishCanary(message: string, exitCode = 0): Promise<void> {
  const job = await canaryJob();
  const pod = await fake!.waitForPod(job.metadata.name);
  fake!.schedule(pod);
  fake!.updatePod(pod, (p) => {
    p.status.containerStatuses = [{ name: 'canary', image: 'x', imageID: '', restartCount: 0, ready: false, started: false, state: { terminated: { exitCode, reason: exitCode === 0 ? 'Completed' : 'Error', message, startedAt: new Date().toISOString(), finishedAt: new Date().toISOString() } } }];
  });
}

describe('preflight on the fake API server', () => {
  it('a canary Job like a run pod; healthy while it runs and once it passed; its Job is deleted', async () => {
    const s = await start();
    const job = await canaryJob();
    const spec = job.spec.template.spec;
    expect(spec.runtimeClassName).toBe('gvisor');
    expect(spec.containers[0].image).toBe('sandpod/executor:test');
    let h = await health(s);
    expect(h.body.sandbox.detail.preflight).toEqual({ status: 'running' });
    expect(h.body.reasons).toEqual([]);
    await finishCanary(report({ threads: true, select: true, subprocess: true }));
    await fake!.waitFor(() => !fake!.get('jobs', 'sandpod-jobs', job.metadata.name), 10_000, 'the canary Job deleted');
    await new Promise((r) => setTimeout(r, 50));
    h = await health(s);
    expect(h.status).toBe(200);
    expect(h.body.status).toBe('healthy');
    expect(h.body.sandbox.detail.preflight).toMatchObject({ status: 'passed' });
  }, 60_000);

  it('threads failing in run pods make /health degraded with the reason; runs are still accepted', async () => {
    const s = await start();
    await finishCanary(report({ threads: "RuntimeError: can't start new thread", select: true, subprocess: true }));
    let h = await health(s);
    for (let i = 0; i < 100 && h.body.status !== 'degraded'; i++) {
      await new Promise((r) => setTimeout(r, 100));
      h = await health(s);
    }
    expect(h.status).toBe(503);
    expect(h.body.status).toBe('degraded');
    expect(h.body.reasons).toHaveLength(1);
    expect(h.body.reasons[0]).toMatch(/^preflight failed: in the run sandbox threads failed \(RuntimeError: can't start new thread\)/);
    expect(h.body.sandbox.detail.preflight).toMatchObject({ status: 'failed', checks: { threads: "RuntimeError: can't start new thread", select: true } });
    // Degraded is a warning to the operator, not a refusal: the API still takes work.
    expect((await s.post('/execute/async', { code: 'print(1)' })).status).toBe(202);
  }, 60_000);

  it('off with kubernetes.preflight=false: no canary, nothing in health', async () => {
    const s = await start({ preflight: false });
    await new Promise((r) => setTimeout(r, 500));
    expect(fake!.list('jobs', 'sandpod-jobs').filter((j) => j.metadata.labels?.[PREFLIGHT_LABEL])).toEqual([]);
    const h = await health(s);
    expect(h.body.sandbox.detail.preflight).toBeUndefined();
    expect(h.body.status).toBe('healthy');
  }, 60_000);
});
