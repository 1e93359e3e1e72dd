/**
 * The run controller's informer caches (issue 20 item 4): what a real API server adds to every
 * object (`managedFields`) and the pods' container commands are not kept, the rest is; a run's pods
 * are found by its execution-id label through the index, also after relabelling and deletion.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { V1Pod } from '@kubernetes/client-node';
import { KubeApi, ReconnectingInformer } from '../../../src/kube/index.ts';
import { slimJob, slimPod } from '../../../src/runtime/kubernetes/runs/cache-transform.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';

const NS = 'sandpod-jobs';
const LABEL = 'sandpod.io/execution-id';
let fake: FakeKube;
let api: KubeApi;

beforeAll(async () => {
  fake = await FakeKube.start({ managedFields: true });
  api = new KubeApi(fake.kubeConfig());
});
afterAll(async () => {
  await fake?.close();
});

async function job(name: string, id: string): Promise<void> {
  await api.createJob({
    apiVersion: 'batch/v1',
    kind: 'Job',
    metadata: { name, namespace: NS, labels: { app: 'ic', [LABEL]: id } },
    spec: {
      template: {
        metadata: { labels: { app: 'ic', [LABEL]: id } },
        spec: {
          restartPolicy: 'Never',
          containers: [
            { name: 'main', image: 'x', command: ['python3', '-c', 'x'.repeat(10_000)], env: [{ name: 'A', value: 'b' }], stdin: true },
            { name: 'collector', image: 'x', command: ['sleep', 'infinity'] },
          ],
        },
      },
    },
  });
}

describe('run informer cache', () => {
  it('drops managedFields and pod container commands, keeps what readers use, and indexes pods by execution', async () => {
    const pods = new ReconnectingInformer<V1Pod>({
      kubeConfig: fake.kubeConfig(),
      name: 'pods',
      path: `/api/v1/namespaces/${NS}/pods`,
      labelSelector: 'app=ic',
      list: () => api.listPods(NS, 'app=ic'),
      transform: slimPod,
      indexBy: (p) => p.metadata?.labels?.[LABEL],
    });
    await job('ic-a', 'exec-a');
    await pods.start();
    try {
      await job('ic-b', 'exec-b');
      await fake.waitFor(() => pods.byIndex('exec-b').length === 1, 5000, 'pod of exec-b in the cache');
      const served = fake.podOfJob('ic-a')!;
      expect((served.metadata as { managedFields?: unknown[] }).managedFields?.length).toBe(1);
      const [a] = pods.byIndex('exec-a');
      expect(a?.metadata?.name).toBe(served.metadata.name);
      expect(a?.metadata?.managedFields).toBeUndefined();
      expect(a?.metadata?.labels?.[LABEL]).toBe('exec-a');
      expect(a?.metadata?.ownerReferences?.[0]?.name).toBe('ic-a');
      expect(a?.spec?.containers.map((c) => [c.name, c.command, c.env, c.stdin])).toEqual([
        ['main', undefined, undefined, true],
        ['collector', undefined, undefined, undefined],
      ]);
      // The status still follows the server.
      fake.mainRunning(served.metadata.name);
      await fake.waitFor(() => !!pods.byIndex('exec-a')[0]?.status?.containerStatuses?.some((s) => s.name === 'main' && s.state?.running), 5000, 'main running in the cache');
      expect(pods.byIndex('nobody')).toEqual([]);
      // Relabelled: found under the new key only; deleted: under none.
      await api.patchPod(NS, served.metadata.name, [{ op: 'replace', path: `/metadata/labels/${LABEL.replace('/', '~1')}`, value: 'exec-c' }]);
      await fake.waitFor(() => pods.byIndex('exec-c').length === 1, 5000, 'relabelled pod under exec-c');
      expect(pods.byIndex('exec-a')).toEqual([]);
      fake.deletePod(served.metadata.name, 0);
      await fake.waitFor(() => pods.byIndex('exec-c').length === 0, 5000, 'deleted pod gone from the index');
      expect(pods.byIndex('exec-b')).toHaveLength(1);
    } finally {
      pods.stop();
    }
  });

  it('slimJob drops only managedFields and slimPod does not change its input', () => {
    const job = { metadata: { name: 'j', managedFields: [{ manager: 'm' }], labels: { a: 'b' } }, spec: { template: { spec: { containers: [{ name: 'main', command: ['x'] }] } } } };
    expect(slimJob(job)).toEqual({ metadata: { name: 'j', labels: { a: 'b' } }, spec: job.spec });
    const pod: V1Pod = { metadata: { name: 'p', managedFields: [{ manager: 'm' }] }, spec: { nodeName: 'n', containers: [{ name: 'main', command: ['x'], args: ['y'] }], initContainers: [{ name: 'deps', command: ['pip'] }] } };
    expect(slimPod(pod)).toEqual({ metadata: { name: 'p' }, spec: { nodeName: 'n', containers: [{ name: 'main' }], initContainers: [{ name: 'deps' }] } });
    expect(pod.spec?.containers[0]?.command).toEqual(['x']);
    expect(pod.metadata?.managedFields).toHaveLength(1);
  });
});
