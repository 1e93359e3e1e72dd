import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import YAML from 'yaml';
import { jobTypeFromResource, KubernetesJobTypeRegistry } from '../../../src/jobtypes/kubernetes-registry.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { testConfig } from '../../support/kube-runtime.ts';

let fake: FakeKube;
let registry: KubernetesJobTypeRegistry;

beforeAll(async () => {
  fake = await FakeKube.start();
  fake.upsertJobType('sandpod', 'data', { pythonVersion: '3.11', requirements: ['numpy'], memoryLimit: '1g', cpuLimit: 2, timeout: 60 });
  registry = new KubernetesJobTypeRegistry(testConfig(), { kubeConfig: fake.kubeConfig(), informerBackoffInitialMs: 10, informerBackoffMaxMs: 100 });
  await registry.start();
});
afterAll(async () => {
  await registry?.stop();
  await fake?.close();
});

describe('JobType registry over custom resources', () => {
  it('lists resources, with the built-in default while none is named default', () => {
    expect(registry.list().map((t) => t.name)).toEqual(['data', 'default']);
    expect(registry.get('data')).toMatchObject({ memoryLimit: '1g', cpuLimit: 2, timeout: 60, requirements: ['numpy'], network: { mode: 'none', allowedHosts: [] } });
  });

  it('reflects creation, change and deletion without a restart', async () => {
    fake.upsertJobType('sandpod', 'http', { network: { mode: 'bridge', allowedHosts: ['api.github.com'] }, timeout: 45 });
    await fake.waitFor(() => registry.get('http') !== undefined, 2000, 'http job type');
    expect(registry.get('http')!.network).toEqual({ mode: 'bridge', allowedHosts: ['api.github.com'] });
    const before = registry.get('http')!.digest;
    fake.upsertJobType('sandpod', 'http', { network: { mode: 'bridge', allowedHosts: ['api.github.com'] }, timeout: 90 });
    await fake.waitFor(() => registry.get('http')?.timeout === 90, 2000, 'http updated');
    expect(registry.get('http')!.digest).not.toBe(before);
    fake.deleteJobType('sandpod', 'http');
    await fake.waitFor(() => registry.get('http') === undefined, 2000, 'http deleted');
  });

  it('a resource named default replaces the built-in', async () => {
    fake.upsertJobType('sandpod', 'default', { memoryLimit: '256m' });
    await fake.waitFor(() => registry.get('default')?.memoryLimit === '256m', 2000, 'default override');
    fake.deleteJobType('sandpod', 'default');
    await fake.waitFor(() => registry.get('default')?.memoryLimit === '512m', 2000, 'builtin default back');
  });

  it('keeps up across a watch close and a 410', async () => {
    fake.closeWatches();
    fake.upsertJobType('sandpod', 'late', { timeout: 5 });
    fake.compact();
    await fake.waitFor(() => registry.get('late') !== undefined, 3000, 'late job type');
  });

  it('skips resources the service schema refuses', async () => {
    fake.upsertJobType('sandpod', 'broken', { memoryLimit: 'lots' });
    fake.upsertJobType('sandpod', 'fine', {});
    await fake.waitFor(() => registry.get('fine') !== undefined, 2000, 'fine');
    expect(registry.get('broken')).toBeUndefined();
  });

  it('reads every field of the CRD (kept in sync with crds/jobtypes.sandpod.io.yaml)', () => {
    const crd = YAML.parse(readFileSync(new URL('../../../crds/jobtypes.sandpod.io.yaml', import.meta.url), 'utf8')) as any;
    const specProps = Object.keys(crd.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties).sort();
    expect(specProps).toEqual(['callbackUrl', 'cpuLimit', 'cpuRequest', 'env', 'image', 'maxFileSize', 'maxProcesses', 'memoryLimit', 'memoryRequest', 'network', 'preload', 'pythonVersion', 'requirements', 'timeout', 'version', 'warmPool']);
    // preload (issue 18) and callbackUrl (issue 21) are read too.
    expect(jobTypeFromResource({ metadata: { name: 'q' }, spec: { preload: ['json'], callbackUrl: 'https://hooks.example/x' } })).toMatchObject({ preload: ['json'], callbackUrl: 'https://hooks.example/x' });
    // warmPool.size is the cluster pool's (not a run's, not in the digest).
    const pooled = jobTypeFromResource({ metadata: { name: 'p' }, spec: { warmPool: { size: 3 } } });
    expect(pooled).toMatchObject({ warmPoolSize: 3 });
    expect(jobTypeFromResource({ metadata: { name: 'p' }, spec: { warmPool: { size: -1 } } })).toMatchObject({ error: expect.stringContaining('warmPool.size') });
    expect((pooled as { digest: string }).digest).toBe((jobTypeFromResource({ metadata: { name: 'p' }, spec: {} }) as { digest: string }).digest);
    const jt = jobTypeFromResource({
      metadata: { name: 'full' },
      spec: {
        pythonVersion: '3.12',
        requirements: ['requests'],
        memoryLimit: '2g',
        cpuLimit: 0.5,
        cpuRequest: 0.1,
        memoryRequest: '1g',
        timeout: 10,
        maxProcesses: 32,
        maxFileSize: '10m',
        network: { mode: 'bridge', allowedHosts: ['*.example.com'] },
        image: 'registry.example/full:1',
        env: { A: 'b' },
        version: '1.2.3',
      },
    });
    expect(jt).toMatchObject({
      name: 'full',
      pythonVersion: '3.12',
      requirements: ['requests'],
      memoryLimit: '2g',
      cpuLimit: 0.5,
      cpuRequest: 0.1,
      memoryRequest: '1g',
      timeout: 10,
      maxProcesses: 32,
      maxFileSize: '10m',
      network: { mode: 'bridge', allowedHosts: ['*.example.com'] },
      image: 'registry.example/full:1',
      env: { A: 'b' },
      version: '1.2.3',
    });
  });
});
