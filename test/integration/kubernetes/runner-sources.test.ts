/**
 * The runner sources ConfigMap (runs/runner-sources.ts) against the fake API server: made before a
 * pod mounts it, made again (at most once a minute) when it is gone, and the leader's removal of
 * unused ones (`staleSources`, a table).
 */
import type { V1ConfigMap, V1Job } from '@kubernetes/client-node';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { KubeApi } from '../../../src/kube/index.ts';
import { silentLogger } from '../../../src/logger.ts';
import { RunnerSources, SOURCES_MIN_AGE_MS, sourcesConfigMap, sourcesName, staleSources } from '../../../src/runtime/kubernetes/runs/runner-sources.ts';
import { FakeKube } from '../../support/kube-runtime.ts';

const NS = 'sandpod-jobs';
const T0 = Date.parse('2026-12-04T12:00:00Z');

describe('staleSources', () => {
  const cm = (name: string, ageMs: number): V1ConfigMap => ({ metadata: { name, creationTimestamp: new Date(T0 - ageMs) } });
  const job = (cmName: string): V1Job => ({ spec: { template: { spec: { containers: [], volumes: [{ name: 'runner', configMap: { name: cmName } }] } } } });
  const OLD = SOURCES_MIN_AGE_MS;
  it.each([
    { name: 'the current one stays, however old and unused', cms: [cm('cur', 10 * OLD)], jobs: [], want: [] },
    { name: 'an old one no Job names goes', cms: [cm('cur', 0), cm('old', OLD)], jobs: [], want: ['old'] },
    { name: 'an old one a Job still names stays (a pod of another version)', cms: [cm('old', 2 * OLD)], jobs: [job('old')], want: [] },
    { name: 'a young one no Job names yet stays (a replica of another version is about to use it)', cms: [cm('new', OLD - 1)], jobs: [], want: [] },
    { name: 'several', cms: [cm('a', OLD), cm('b', OLD), cm('cur', OLD)], jobs: [job('b')], want: ['a'] },
  ])('$name', ({ cms, jobs, want }) => {
    expect(staleSources(cms, jobs, 'cur', T0)).toEqual(want);
  });
});

describe('RunnerSources against the fake API server', () => {
  let fake: FakeKube;
  beforeEach(async () => {
    fake = await FakeKube.start();
  });
  afterEach(async () => {
    await fake.close();
  });

  it('ensure creates the ConfigMap (immutable, all three texts) once; gone, it comes back after a minute; the leader removes an unused one', async () => {
    let now = T0;
    const api = new KubeApi(fake.kubeConfig());
    const sources = new RunnerSources({ api, namespace: NS, instance: 'i1', clock: { now: () => now }, log: silentLogger, runner: 'RUNNER', deliver: 'DELIVER', session: 'SESSION' });
    const texts = { runner: 'RUNNER', deliver: 'DELIVER', session: 'SESSION' };
    const name = sourcesName(texts);
    expect(sources.name()).toBe(name);
    // Another text, another name: a service of another version mounts its own.
    for (const key of ['runner', 'deliver', 'session'] as const) expect(sourcesName({ ...texts, [key]: `${texts[key]}2` }), key).not.toBe(name);
    // The texts are hashed apart: moving a byte from one to the next gives another name.
    expect(sourcesName({ runner: 'RUNNERD', deliver: 'ELIVER', session: 'SESSION' })).not.toBe(name);
    await Promise.all([sources.ensure(), sources.ensure()]);
    const made = fake.get('configmaps', NS, name)!;
    expect(made.immutable).toBe(true);
    expect(made.data).toEqual({ 'runner.py': 'RUNNER', 'deliver.py': 'DELIVER', 'session-collector.py': 'SESSION' });
    const creates = () => fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/configmaps')).length;
    expect(creates()).toBe(1);

    await api.deleteConfigMap(NS, name);
    now += 30_000;
    await sources.ensure();
    expect(creates()).toBe(1);
    expect(fake.get('configmaps', NS, name)).toBeUndefined();
    now += 31_000;
    await sources.ensure();
    expect(creates()).toBe(2);
    expect(fake.get('configmaps', NS, name)).toBeDefined();
    // Exists already: a 409, no error.
    now += 61_000;
    await sources.ensure();
    expect(creates()).toBe(3);

    // An older version's ConfigMap of this instance, and another instance's: only ours, when unused, goes.
    await api.createConfigMap(sourcesConfigMap(NS, 'i1', { ...texts, runner: 'OLD' }));
    await api.createConfigMap(sourcesConfigMap(NS, 'i2', { ...texts, runner: 'OTHER' }));
    now = Date.now() + SOURCES_MIN_AGE_MS;
    await sources.collectGarbage([]);
    expect(fake.list('configmaps', NS).map((c) => c.metadata.name).sort()).toEqual([name, sourcesName({ ...texts, runner: 'OTHER' })].sort());
  });
});
