/** Shared set-up of the Kubernetes runtime tests: a fake API server and a runtime pointed at it. */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as v from 'valibot';
import { JobTypeConfigSchema, parseConfig, type Config } from '../../src/config.ts';
import { fromConfig, type JobType } from '../../src/jobtypes/job-type.ts';
import { createKubernetesRuntime, type KubernetesRuntimeOptions } from '../../src/runtime/kubernetes/index.ts';
import { jobNameFor } from '../../src/runtime/kubernetes/names.ts';
import type { Runtime, RunSpec } from '../../src/runtime/runtime.ts';
import { FakeKube } from './fake-kube/server.ts';

/** A config for the kubernetes runtime with test-friendly values. */
export function testConfig(over: Record<string, unknown> = {}): Config {
  return parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false }, ...over }, {});
}

/** A job type from its config form. */
export function jobType(over: Record<string, unknown> = {}): JobType {
  return fromConfig(v.parse(JobTypeConfigSchema, { name: 'default', ...over }));
}

let seq = 0;
/** A run spec with a fresh execution id. */
export function spec(over: Partial<RunSpec> = {}): RunSpec {
  seq++;
  return {
    executionId: `0000${seq.toString(16).padStart(4, '0')}-aaaa-4bbb-8ccc-${Date.now().toString(16).padStart(12, '0').slice(-12)}`,
    code: 'print("hi")',
    inputJson: '{}',
    jobType: jobType(),
    timeoutSec: 30,
    startupTimeoutSec: 60,
    requirements: [],
    maxStdoutBytes: 32768,
    maxArtifactBytes: 1024 * 1024,
    ...over,
  };
}

/** Fast timings for tests. */
export const FAST_TUNING: NonNullable<KubernetesRuntimeOptions['tuning']> = {
  podGoneGraceMs: 150,
  execTimeoutMs: 5000,
  informerBackoffInitialMs: 20,
  informerBackoffMaxMs: 200,
  healthCacheMs: 0,
};

/** A started runtime against a fake. */
export async function startRuntime(
  fake: FakeKube,
  opts: { config?: Config; options?: Partial<KubernetesRuntimeOptions> } = {},
): Promise<Runtime> {
  const rt = createKubernetesRuntime(opts.config ?? testConfig(), {
    kubeConfig: fake.kubeConfig(),
    runnerSource: '# runner stub for tests\n',
    tuning: FAST_TUNING,
    ...opts.options,
  });
  await rt.start();
  return rt;
}

/** The pod of a run, once the fake's Job controller made it. */
export function podOf(fake: FakeKube, s: RunSpec): Promise<string> {
  return fake.waitForPod(jobNameFor(s.executionId));
}

/** Writes a kubeconfig file (in a temp dir) that reaches the fake; returns its path (for a child's `KUBECONFIG`). */
export function fakeKubeconfigFile(fake: FakeKube): string {
  const file = path.join(mkdtempSync(path.join(tmpdir(), 'kubeconfig-')), 'config');
  writeFileSync(
    file,
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'fake', cluster: { server: fake.url, 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'fake', user: { token: 'fake-token' } }],
      contexts: [{ name: 'fake', context: { cluster: 'fake', user: 'fake' } }],
      'current-context': 'fake',
    }),
  );
  return file;
}

/**
 * Points `KUBECONFIG` at the fake (a kubeconfig file in a temp dir), so code that loads its
 * configuration the way main.ts does reaches it. Returns a function that restores the old value.
 */
export function useFakeKubeconfig(fake: FakeKube): () => void {
  const saved = process.env.KUBECONFIG;
  process.env.KUBECONFIG = fakeKubeconfigFile(fake);
  return () => {
    if (saved === undefined) delete process.env.KUBECONFIG;
    else process.env.KUBECONFIG = saved;
  };
}

export { FakeKube, jobNameFor };
