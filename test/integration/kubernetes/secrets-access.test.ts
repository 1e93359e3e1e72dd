/**
 * The runs Role grants `create` and `delete` on Secrets, not `get` (issue 22 item 8): run Secrets have
 * per-run names that `resourceNames` cannot list, so the service must never need to read a Secret of
 * the runs namespace. Checked on every path that makes a run Secret — a fresh run, a Secret of that
 * name left by an earlier attempt, and adoption after a restart — from the fake API server's request
 * log: no GET (and no LIST or WATCH) of Secrets there, and the Secret ends up owned by the run's Job.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KubeApi } from '../../../src/kube/kube-api.ts';
import type { Runtime } from '../../../src/runtime/runtime.ts';
import { FakeKube, jobNameFor, podOf, spec, startRuntime } from '../../support/kube-runtime.ts';

let fake: FakeKube;
let rt: Runtime;

beforeAll(async () => {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  rt = await startRuntime(fake);
});
afterAll(async () => {
  await rt?.stop();
  await fake?.close();
});

/** Requests since `from` that read Secrets of the runs namespace (get, list or watch). */
const secretReads = (from: number) =>
  fake.requests.slice(from).filter((r) => r.method === 'GET' && /\/namespaces\/sandpod-jobs\/secrets/.test(r.path)).map((r) => `${r.method} ${r.path}`);
const ownerOf = (name: string) => (fake.get('secrets', 'sandpod-jobs', name)?.metadata.ownerReferences ?? []).map((o) => o.uid);

describe('run Secrets are never read', () => {
  it('a fresh run creates its Secret, owned by its Job, without reading any', async () => {
    const s = spec();
    const before = fake.requests.length;
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.mainTerminated(pod, 0);
    expect((await running).observation.exitCode).toBe(0);
    expect(ownerOf(jobNameFor(s.executionId))).toEqual([fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))!.metadata.uid]);
    expect(secretReads(before)).toEqual([]);
  });

  it('a Secret of that name from an earlier attempt (its Job gone) is replaced without being read', async () => {
    const s = spec();
    const name = jobNameFor(s.executionId);
    await new KubeApi(fake.kubeConfig()).createSecret({
      metadata: { name, namespace: 'sandpod-jobs', ownerReferences: [{ apiVersion: 'batch/v1', kind: 'Job', name, uid: randomUUID() }] },
      stringData: { 'main.py': 'old' },
    });
    const before = fake.requests.length;
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.mainTerminated(pod, 0);
    expect((await running).observation.exitCode).toBe(0);
    expect(ownerOf(name)).toEqual([fake.get('jobs', 'sandpod-jobs', name)!.metadata.uid]);
    expect(Buffer.from((fake.get('secrets', 'sandpod-jobs', name) as unknown as { data: Record<string, string> }).data['main.py']!, 'base64').toString()).toBe(s.code);
    expect(secretReads(before)).toEqual([]);
  });

  it('adoption after a restart keeps the Secret the Job owns, without reading it', async () => {
    const s = spec();
    const name = jobNameFor(s.executionId);
    const first = await startRuntime(fake);
    const lost = first.run(s).catch((e: unknown) => e);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    await first.stop();
    expect(await lost).toBeInstanceOf(Error);
    const before = fake.requests.length;
    const second = await startRuntime(fake, { options: { hooks: { liveExecutionIds: async (ids) => new Set(ids) } } });
    try {
      const adopted = second.run(s, { adopt: true });
      fake.setOutput(pod, { stdout: 'survived' });
      fake.mainTerminated(pod, 0);
      expect((await adopted).stdout).toBe('survived');
    } finally {
      await second.stop();
    }
    expect(ownerOf(name)).toEqual([fake.get('jobs', 'sandpod-jobs', name)!.metadata.uid]);
    expect(secretReads(before)).toEqual([]);
  });
});
