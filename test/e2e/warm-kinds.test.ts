/**
 * Pool pods of every kind on a real cluster (issue 18 item 4), with `SANDPOD_E2E_GVISOR=1` under real
 * gVisor: a `data` type whose image has Debian's numpy and pandas (`SANDPOD_E2E_DATA_IMAGE`) and that
 * preloads them runs pandas on a claimed pool pod; an `allowed_hosts` type is pooled and each run's
 * egress proxy credential reaches the program at the claim (none in the pod spec); a built type's pool
 * pods run its image by digest (`SANDPOD_E2E_BUILT_IMAGE`, an image reference pinned by digest).
 * Skipped without `SANDPOD_E2E_KUBECONFIG` and `SANDPOD_E2E_DATA_IMAGE`.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BatchV1Api, KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.ts';
import { verifyEgressToken } from '../../src/egress/token.ts';
import type { JobType } from '../../src/jobtypes/job-type.ts';
import { KubernetesJobTypeRegistry } from '../../src/jobtypes/kubernetes-registry.ts';
import { createKubernetesRuntime } from '../../src/runtime/kubernetes/index.ts';
import type { Runtime, RunSpec } from '../../src/runtime/runtime.ts';
import { applyObjects, manifestObjects } from '../support/kube-apply.ts';

const KUBECONFIG = process.env.SANDPOD_E2E_KUBECONFIG;
const IMAGE = process.env.SANDPOD_E2E_IMAGE ?? 'ghcr.io/sandpod/executor:0.1.0';
const DATA_IMAGE = process.env.SANDPOD_E2E_DATA_IMAGE;
const BUILT_IMAGE = process.env.SANDPOD_E2E_BUILT_IMAGE;
const GVISOR = process.env.SANDPOD_E2E_GVISOR === '1';
const NS = 'sandpod-e2e';
const RUNS_NS = 'sandpod-e2e-jobs';
const KEY = 'e2e-egress-key-'.repeat(4);

function manifests(): KubernetesObject[] {
  return manifestObjects([
    ...readdirSync(new URL('../../crds/', import.meta.url)).filter((f) => f.endsWith('.yaml')).map((f) => new URL(`../../crds/${f}`, import.meta.url)),
    ...['namespaces.yaml', 'runtimeclass.yaml'].map((f) => new URL(`./manifests/${f}`, import.meta.url)),
  ]);
}

describe.skipIf(!KUBECONFIG || !DATA_IMAGE)('pool pods of every kind on a cluster (needs SANDPOD_E2E_KUBECONFIG and SANDPOD_E2E_DATA_IMAGE)', () => {
  let kc: KubeConfig;
  let registry: KubernetesJobTypeRegistry;
  let rt: Runtime;
  const instance = `e2e-kinds-${randomUUID().slice(0, 6)}`;
  const types = ['data-e2e', 'web-e2e', ...(BUILT_IMAGE ? ['built-e2e'] : [])];

  /** The job types as runs see them; the built one with its build pinned to BUILT_IMAGE. */
  const jobTypes = (): JobType[] =>
    registry
      .list()
      .filter((t) => types.includes(t.name))
      .map((t) => (t.name === 'built-e2e' && BUILT_IMAGE ? { ...t, build: { id: 'e2e', digest: BUILT_IMAGE.split('@sha256:')[1]!, imageRef: BUILT_IMAGE, pythonVersion: '3.11', lock: [], version: 'latest', builtAt: new Date(0) } } : t));
  const spec = (jobType: string, code: string): RunSpec => ({
    executionId: randomUUID(),
    code,
    inputJson: '{}',
    jobType: jobTypes().find((t) => t.name === jobType)!,
    timeoutSec: 60,
    startupTimeoutSec: 180,
    requirements: [...jobTypes().find((t) => t.name === jobType)!.requirements],
    maxStdoutBytes: 32768,
    maxArtifactBytes: 1024 * 1024,
  });
  const stats = (jt: string) => rt.warmPoolStats!().find((x) => x.job_type === jt);
  const waitReady = async (jt: string) => {
    for (let i = 0; i < 480 && (stats(jt)?.ready ?? 0) < 1; i++) await new Promise((res) => setTimeout(res, 500));
    expect(stats(jt)?.ready ?? 0, `${jt}: a ready pool pod`).toBeGreaterThanOrEqual(1);
  };
  /** Runs `s` on a pool pod of its job type and requires a hit. */
  const runWarm = async (s: RunSpec) => {
    await waitReady(s.jobType.name);
    const before = stats(s.jobType.name)?.hits ?? 0;
    const raw = await rt.run(s);
    expect(stats(s.jobType.name)?.hits, `${s.jobType.name}: the run claimed a pool pod`).toBe(before + 1);
    return raw;
  };

  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    const jt = (name: string, spec: Record<string, unknown>) => ({ apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType', metadata: { name, namespace: NS }, spec }) as KubernetesObject;
    await applyObjects(kc, [
      ...manifests(),
      jt('data-e2e', { image: DATA_IMAGE, preload: ['numpy', 'pandas'], memoryLimit: '512m', cpuLimit: 1, timeout: 60, warmPool: { size: 1 } }),
      jt('web-e2e', { memoryLimit: '256m', cpuLimit: 0.5, timeout: 30, network: { mode: 'bridge', allowedHosts: ['example.com'] }, warmPool: { size: 1 } }),
      ...(BUILT_IMAGE ? [jt('built-e2e', { requirements: ['pandas'], memoryLimit: '512m', cpuLimit: 1, timeout: 60, warmPool: { size: 1 } })] : []),
    ]);
    const keyFile = path.join(mkdtempSync(path.join(tmpdir(), 'e2e-kinds-')), 'key');
    writeFileSync(keyFile, KEY);
    const config = parseConfig(
      {
        runtime: 'kubernetes',
        security_mode: GVISOR ? 'strict' : 'permissive',
        kubernetes: {
          namespace: NS,
          runs_namespace: RUNS_NS,
          instance,
          runtime_class: GVISOR ? 'gvisor-e2e' : 'no-such-runtime-class',
          executor_image: IMAGE,
          ttl_seconds_after_finished: 120,
          preflight: false,
          warm_pool_size: 0,
          egress_proxy: { url: 'http://10.96.0.250:3128', key_file: keyFile },
        },
      },
      {},
    );
    registry = new KubernetesJobTypeRegistry(config, { kubeConfig: kc });
    await registry.start();
    for (let i = 0; i < 100 && types.some((t) => !registry.list().some((x) => x.name === t)); i++) await new Promise((r) => setTimeout(r, 100));
    rt = createKubernetesRuntime(config, { kubeConfig: kc, jobTypes, tuning: { poolIntervalMs: 500 } });
    await rt.start();
  }, 300_000);

  afterAll(async () => {
    await rt?.stop();
    await registry?.stop();
    // Their pools would follow any other service of these namespaces (the bench's, another e2e file's).
    const { CustomObjectsApi } = await import('@kubernetes/client-node');
    const custom = kc?.makeApiClient(CustomObjectsApi);
    for (const name of types) await custom?.deleteNamespacedCustomObject({ group: 'sandpod.io', version: 'v1alpha1', namespace: NS, plural: 'jobtypes', name }).catch(() => undefined);
    // Pool Jobs outlive a stopped runtime (a restart adopts them): this instance is gone for good.
    await kc
      ?.makeApiClient(BatchV1Api)
      .deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance}`, propagationPolicy: 'Background' })
      .catch(() => undefined);
  });

  it('data: a pool pod with pandas preloaded runs pandas; the import was done before the program came', async () => {
    const raw = await runWarm(spec('data-e2e', 'import sys\npreloaded = "pandas" in sys.modules\nimport pandas as pd\nprint(pd.DataFrame({"a": [1, 2]}).a.sum(), preloaded)'));
    expect(raw.observation).toMatchObject({ exitCode: 0, phase: 'completed', infraError: null });
    expect(raw.stdout).toBe('3 True\n');
  }, 600_000);

  it('allowed_hosts: pooled; the run credential reaches the program at the claim, never the pod spec', async () => {
    const s = spec('web-e2e', 'import os\nprint(os.environ.get("HTTPS_PROXY"))');
    const raw = await runWarm(s);
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    const url = new URL(raw.stdout.trim());
    expect(url.host).toBe('10.96.0.250:3128');
    expect(verifyEgressToken(decodeURIComponent(url.password), KEY, Date.now())).toMatchObject({ grant: { executionId: s.executionId, allowedHosts: ['example.com'] } });
    const jobs = await kc.makeApiClient(BatchV1Api).listNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/execution-id=${s.executionId}` });
    expect(jobs.items).toHaveLength(1);
    expect(jobs.items[0]!.metadata?.labels?.['sandpod.io/warm-pool']).toBe('web-e2e');
    expect(JSON.stringify(jobs.items[0]!.spec)).not.toContain(url.password);
  }, 600_000);

  it.skipIf(!BUILT_IMAGE)('a built type: its pool pods run the built image by digest', async () => {
    const raw = await runWarm(spec('built-e2e', 'import pandas\nprint(pandas.__name__)'));
    expect(raw.stdout).toBe('pandas\n');
    const jobs = await kc.makeApiClient(BatchV1Api).listNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance},sandpod.io/warm-pool=built-e2e` });
    expect(jobs.items.length).toBeGreaterThan(0);
    for (const j of jobs.items) expect(j.spec?.template.spec?.containers.find((c) => c.name === 'main')?.image).toBe(BUILT_IMAGE);
  }, 600_000);
});
