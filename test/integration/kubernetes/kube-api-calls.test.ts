/**
 * Two things of the client layer (src/kube/kube-api.ts) the run path leans on at scale, against the
 * fake API server: the run's Secret and Job creates, which skip the generated client's model objects
 * (send-json.ts), still answer as every other call does (created, 409, 5xx, 4xx, deadline), and no
 * more than 32 calls are at work at once (call-gate.ts): the rest wait, unbuilt, and keep their deadline.
 */
import type { V1Secret } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UnretryableError } from '../../../src/errors.ts';
import { KubeApi, KubeTimeoutError, isApiUnavailable } from '../../../src/kube/index.ts';
import { MAX_API_SOCKETS } from '../../../src/kube/kube-api.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';

const NS = 'sandpod-jobs';
let fake: FakeKube;
let api: KubeApi;

beforeAll(async () => {
  fake = await FakeKube.start();
  api = new KubeApi(fake.kubeConfig(), { requestTimeoutMs: 500 });
});
afterAll(async () => {
  await fake?.close();
});

const big = Buffer.alloc(60_000, 'r').toString('base64');
const secret = (name: string): V1Secret => ({
  apiVersion: 'v1',
  kind: 'Secret',
  metadata: { name, namespace: NS, labels: { 'sandpod.io/execution-id': name }, ownerReferences: [{ apiVersion: 'batch/v1', kind: 'Job', name: `sp-${name}`, uid: 'u-1', controller: true }] },
  type: 'Opaque',
  data: { 'main.py': Buffer.from('print(1)').toString('base64'), 'runner.py': big },
});
const posts = (from: number) => fake.requests.slice(from).filter((r) => r.method === 'POST' && r.path === `/api/v1/namespaces/${NS}/secrets`);

describe('createSecret (answer not read)', () => {
  it('creates the Secret as sent, with the deadline passed on, and says false when it exists (409)', async () => {
    const from = fake.requests.length;
    expect(await api.createSecret(secret('s-one'))).toBe(true);
    const stored = fake.get('secrets', NS, 's-one')!;
    expect(stored.data).toEqual(secret('s-one').data);
    expect(stored.metadata.labels).toEqual({ 'sandpod.io/execution-id': 's-one' });
    expect(stored.metadata.ownerReferences).toEqual(secret('s-one').metadata!.ownerReferences);
    expect(posts(from)).toHaveLength(1);
    expect(await api.createSecret(secret('s-one'))).toBe(false);
  });

  it('a 500 is an error that says the API is unavailable; a 403 is unretryable, with the server message', async () => {
    fake.failNext(/\/secrets$/, 500, 1, 'POST');
    const e500 = await api.createSecret(secret('s-500')).catch((e: unknown) => e);
    expect(e500).toBeInstanceOf(Error);
    expect(e500).not.toBeInstanceOf(UnretryableError);
    expect(isApiUnavailable(e500)).toBe(true);
    fake.failNext(/\/secrets$/, 403, 1, 'POST');
    const e403 = await api.createSecret(secret('s-403')).catch((e: unknown) => e);
    expect(e403).toBeInstanceOf(UnretryableError);
    expect(String(e403)).toMatch(/create secret: HTTP 403/);
    expect(isApiUnavailable(e403)).toBe(false);
    // Nothing was stored by the refused calls; the next one works.
    expect(fake.get('secrets', NS, 's-500')).toBeUndefined();
    expect(await api.createSecret(secret('s-500'))).toBe(true);
  });

  it('a create never answered fails with KubeTimeoutError within its deadline', async () => {
    fake.hang({ path: /\/secrets$/, method: 'POST' });
    try {
      const t0 = Date.now();
      const err = await api.createSecret(secret('s-hang')).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(KubeTimeoutError);
      expect(String(err)).toMatch(/create secret: no answer from the Kubernetes API within 500 ms/);
      expect(Date.now() - t0).toBeLessThan(3000);
    } finally {
      fake.clearHang();
    }
  });
});

describe('createJobUid (answer read for its uid only)', () => {
  const job = (name: string) => ({
    apiVersion: 'batch/v1',
    kind: 'Job',
    metadata: { name, namespace: NS, labels: { 'sandpod.io/execution-id': name } },
    spec: { template: { spec: { restartPolicy: 'Never', containers: [{ name: 'main', image: 'x' }] } } },
  });

  it("gives the stored Job's uid, null when the name is taken (409); refusals are errors as for every call", async () => {
    const uid = await api.createJobUid(job('j-one'));
    expect(uid).toBe(fake.get('jobs', NS, 'j-one')!.metadata.uid);
    expect(uid).toMatch(/\S/);
    expect(await api.createJobUid(job('j-one'))).toBeNull();
    fake.failNext(/\/jobs$/, 503, 1, 'POST');
    const e503 = await api.createJobUid(job('j-503')).catch((e: unknown) => e);
    expect(isApiUnavailable(e503)).toBe(true);
    fake.failNext(/\/jobs$/, 422, 1, 'POST');
    expect(await api.createJobUid(job('j-422')).catch((e: unknown) => e)).toBeInstanceOf(UnretryableError);
    expect(fake.get('jobs', NS, 'j-503')).toBeUndefined();
  });
});

describe('calls at work at once', () => {
  it(`at most ${MAX_API_SOCKETS} reach the server while it holds them; the others wait and keep their deadline`, async () => {
    // A deadline long enough for a loaded machine to see the calls arrive before it passes.
    const gated = new KubeApi(fake.kubeConfig(), { requestTimeoutMs: 4000 });
    fake.hang({ path: /\/secrets$/, method: 'POST' });
    const from = fake.requests.length;
    try {
      const calls = Array.from({ length: MAX_API_SOCKETS + 8 }, (_, i) => gated.createSecret(secret(`s-gate-${i}`)).catch((e: unknown) => e));
      await fake.waitFor(() => posts(from).length === MAX_API_SOCKETS, 3000, 'the first calls to arrive');
      expect(gated.gate.inUse).toBe(MAX_API_SOCKETS);
      expect(gated.gate.queued).toBe(8);
      const errs = await Promise.all(calls);
      // Every call, sent or still waiting, failed at its deadline, counted from when it was made.
      expect(errs.every((e) => e instanceof KubeTimeoutError)).toBe(true);
      expect(gated.gate.inUse).toBe(0);
      expect(gated.gate.queued).toBe(0);
    } finally {
      fake.clearHang();
    }
    // The gate is free again: a call goes through at once.
    expect(await gated.createSecret(secret('s-after'))).toBe(true);
  });
});
