/**
 * The network check against the in-repo fake API server (issue 23 item 2): the whole service starts,
 * reads its own Service's ClusterIP and port from the API, runs a canary Job made as a `network: none`
 * run pod that connects there, and `/health` reports what the canary said — degraded with "network
 * policy not enforced" when it connected, healthy when it could not.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { NETWORK_CHECK_ROLE } from '../../../src/runtime/kubernetes/checks/network-check.ts';
import { PREFLIGHT_LABEL } from '../../../src/runtime/kubernetes/checks/preflight.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
const report = (result: Record<string, unknown>) => JSON.stringify({ sandpod_network_check: 1, target: '10.96.0.40:8000', result });

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

async function start(kubernetes: J = {}, withService = true): Promise<TestService> {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  fake.addRuntimeClass('gvisor-nonet', 'runsc-nonet');
  if (withService) fake.addService('sandpod', 'sandpod-api', '10.96.0.40', 8000);
  fake.upsertJobType('sandpod', 'default', { pythonVersion: '3.11', memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
  restore = useFakeKubeconfig(fake);
  database = await freshDatabase();
  svc = await startTestService(
    { runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, watch_job_types: true, network_check_service: 'sandpod-api', runtime_class_network_none: 'gvisor-nonet', ...kubernetes } },
    {},
    database,
  );
  return svc;
}

async function canaryJob(): Promise<J> {
  let job: J | undefined;
  await fake!.waitFor(() => (job = fake!.list('jobs', 'sandpod-jobs').find((j) => j.metadata.labels?.[PREFLIGHT_LABEL] === NETWORK_CHECK_ROLE)) !== undefined, 10_000, 'the network canary Job');
  return job!;
}

async function finishCanary(message: string): Promise<void> {
  const job = await canaryJob();
  const pod = await fake!.waitForPod(job.metadata.name);
  fake!.schedule(pod);
  fake!.updatePod(pod, (p) => {
    p.status.containerStatuses = [{ name: 'canary', image: 'x', imageID: '', restartCount: 0, ready: false, started: false, state: { terminated: { exitCode: 0, reason: 'Completed', message, startedAt: new Date().toISOString(), finishedAt: new Date().toISOString() } } }];
  });
}

async function healthUntil(s: TestService, until: (b: J) => boolean): Promise<{ status: number; body: J }> {
  let res = await s.get('/health');
  let body = (await res.json()) as J;
  for (let i = 0; i < 100 && !until(body); i++) {
    await new Promise((r) => setTimeout(r, 100));
    res = await s.get('/health');
    body = (await res.json()) as J;
  }
  return { status: res.status, body };
}

describe('network check on the fake API server', () => {
  it('the canary is a network none pod aimed at the Service; connecting makes /health degraded: network policy not enforced', async () => {
    const s = await start();
    const job = await canaryJob();
    const spec = job.spec.template.spec;
    expect(spec.runtimeClassName).toBe('gvisor-nonet');
    expect(spec.dnsPolicy).toBe('None');
    expect(job.spec.template.metadata.labels['sandpod.io/network']).toBe('none');
    expect(spec.containers[0].command.slice(-3, -1)).toEqual(['10.96.0.40', '8000']);
    await finishCanary(report({ reached: true, attempts: 1 }));
    const h = await healthUntil(s, (b) => b.status === 'degraded');
    expect(h.status).toBe(503);
    expect(h.body.status).toBe('degraded');
    expect(h.body.reasons).toEqual([expect.stringMatching(/^network policy not enforced: .*10\.96\.0\.40:8000/)]);
    expect(h.body.sandbox.detail.network_check).toMatchObject({ status: 'not_isolated', target: '10.96.0.40:8000' });
    await fake!.waitFor(() => !fake!.get('jobs', 'sandpod-jobs', job.metadata.name), 10_000, 'the canary Job deleted');
    // A warning to the operator, not a refusal.
    expect((await s.post('/execute/async', { code: 'print(1)' })).status).toBe(202);
  }, 60_000);

  it('a canary that cannot connect leaves /health healthy, with the check in the detail', async () => {
    const s = await start();
    await finishCanary(report({ reached: false, refused: false, error: 'OSError: [Errno 113] No route to host' }));
    const h = await healthUntil(s, (b) => b.sandbox?.detail?.network_check?.status === 'isolated');
    expect(h.body.sandbox.detail.network_check).toMatchObject({ status: 'isolated', error: expect.stringMatching(/No route to host/) });
    await fake!.waitFor(() => fake!.list('jobs', 'sandpod-jobs').every((j) => j.metadata.labels?.[PREFLIGHT_LABEL] !== NETWORK_CHECK_ROLE), 10_000, 'the canary Job deleted');
    const after = await healthUntil(s, (b) => b.status === 'healthy');
    expect(after.body.reasons).toEqual([]);
    expect(after.status).toBe(200);
  }, 60_000);

  it('a missing network-none RuntimeClass is reported at once, without a canary', async () => {
    const s = await start({ runtime_class_network_none: 'no-such-class' });
    const h = await healthUntil(s, (b) => b.status === 'degraded');
    expect(h.body.reasons).toEqual([expect.stringMatching(/^network check failed: RuntimeClass no-such-class \(runtime_class_network_none\) does not exist/)]);
    expect(fake!.list('jobs', 'sandpod-jobs').filter((j) => j.metadata.labels?.[PREFLIGHT_LABEL] === NETWORK_CHECK_ROLE)).toEqual([]);
  }, 60_000);

  it('the Service missing: inconclusive in the detail, not degraded; unset: no check at all', async () => {
    let s = await start({}, false);
    let h = await healthUntil(s, (b) => b.sandbox?.detail?.network_check?.status === 'inconclusive');
    expect(h.body.sandbox.detail.network_check.reason).toMatch(/Service sandpod-api not found/);
    expect(h.body.reasons.filter((r: string) => /network/.test(r))).toEqual([]);
    await svc!.close();
    await database!.drop();
    await fake!.close();
    restore!();
    s = await start({ network_check_service: null });
    await new Promise((r) => setTimeout(r, 500));
    h = await healthUntil(s, () => true);
    expect(h.body.sandbox.detail.network_check).toBeUndefined();
    expect(fake!.list('jobs', 'sandpod-jobs').filter((j) => j.metadata.labels?.[PREFLIGHT_LABEL] === NETWORK_CHECK_ROLE)).toEqual([]);
  }, 60_000);
});
