/**
 * The chart and the Kubernetes runtime agree: run Jobs built by the runtime's own `buildJob` from the
 * chart's rendered config and sample JobTypes land in the namespace the Role covers, are selected by
 * the right NetworkPolicies, and pass the runs namespace's Pod Security `restricted` level.
 */
import * as v from 'valibot';
import YAML from 'yaml';
import { beforeAll, expect, it } from 'vitest';
import { JobTypeConfigSchema, parseConfig, type Config } from '../../../src/config.ts';
import { fromConfig, type JobType } from '../../../src/jobtypes/job-type.ts';
import { buildJob } from '../../../src/runtime/kubernetes/runs/build-job.ts';
import type { RunSpec } from '../../../src/runtime/runtime.ts';
import { qosClassOf } from '../../support/fake-kube/qos.ts';
import {
  DB_URL,
  TOOL_BUILD_TIMEOUT_MS,
  byKind,
  RENDERER,
  describeRendered,
  one,
  prepareRenderer,
  renderOk,
  restrictedViolations,
  withDb,
  type Manifest,
} from '../../support/chart.ts';

let docs: Manifest[];
let config: Config;
let jobTypes: Map<string, JobType>;

beforeAll(() => {
  if (!RENDERER) return;
  prepareRenderer();
  docs = renderOk(withDb());
  config = parseConfig(YAML.parse(one(docs, 'ConfigMap').data['config.yaml']), { SVC_DATABASE_URL: DB_URL });
  jobTypes = new Map(
    byKind(docs, 'JobType').map((jt) => {
      const s = jt.spec;
      const conf = v.parse(JobTypeConfigSchema, {
        name: jt.metadata.name,
        python_version: s.pythonVersion,
        requirements: s.requirements,
        memory_limit: s.memoryLimit,
        cpu_limit: s.cpuLimit,
        timeout: s.timeout,
        network: { mode: s.network?.mode, allowed_hosts: s.network?.allowedHosts },
        ...(s.cpuRequest !== undefined ? { cpu_request: s.cpuRequest } : {}),
        ...(s.memoryRequest !== undefined ? { memory_request: s.memoryRequest } : {}),
      });
      return [jt.metadata.name, fromConfig(conf)];
    }),
  );
}, TOOL_BUILD_TIMEOUT_MS);

function runJob(jobTypeName: string, cfg: Config = config): Manifest {
  const jobType = jobTypes.get(jobTypeName)!;
  const spec: RunSpec = {
    executionId: `0190c0de-0000-7000-8000-00000000000${jobTypeName.length}`,
    code: 'print(1)',
    inputJson: '{}',
    jobType,
    timeoutSec: jobType.timeout,
    startupTimeoutSec: 60,
    requirements: jobType.requirements,
    maxStdoutBytes: config.max_stdout_bytes,
    maxArtifactBytes: config.max_artifact_bytes,
  };
  const { job } = buildJob(spec, jobType, cfg, {
    runtimeClassName: config.kubernetes.runtime_class,
    sources: 'sandpod-runner-test',
  });
  return job as Manifest;
}

function selects(policy: Manifest, labels: Record<string, string>): boolean {
  return Object.entries(policy.spec.podSelector.matchLabels as Record<string, string>).every(([k, val]) => labels[k] === val);
}

describeRendered('run Jobs built from the chart’s config', () => {
  it('go to the runs namespace, where the chart’s Role and NetworkPolicies live', () => {
    const job = runJob('default');
    expect(job.metadata.namespace).toBe('sandpod-jobs');
    expect(one(docs, 'Role', 'sandpod-runs').metadata.namespace).toBe(job.metadata.namespace);
    // Every run-side policy (the API pods' policy lives with the API, in the release namespace).
    for (const np of byKind(docs, 'NetworkPolicy').filter((n) => n.metadata.name.includes('-runs-'))) expect(np.metadata.namespace).toBe(job.metadata.namespace);
    expect(one(docs, 'Namespace').metadata.name).toBe(job.metadata.namespace);
  });

  it('use the chart’s executor image and RuntimeClass', () => {
    const pod = runJob('data').spec.template.spec;
    expect(pod.runtimeClassName).toBe('gvisor');
    for (const c of [...pod.initContainers, ...pod.containers]) expect(c.image).toBe('ghcr.io/sandpod/executor:0.1.0');
  });

  it.each(['default', 'data', 'http'])('%s: by default requests a fraction of its limits (Burstable); runs.requests fractions of 1 make it Guaranteed', (name) => {
    const pod = runJob(name).spec.template.spec;
    expect(qosClassOf(pod)).toBe('Burstable');
    const main = pod.containers.find((c: { name: string }) => c.name === 'main');
    const milli = (q: string) => Number(q.replace(/m$/, ''));
    expect(milli(main.resources.requests.cpu) * 4).toBe(milli(main.resources.limits.cpu));
    const full = parseConfig(YAML.parse(one(renderOk(withDb('--set', 'runs.requests.cpuFraction=1', '--set', 'runs.requests.memoryFraction=1')), 'ConfigMap').data['config.yaml']), { SVC_DATABASE_URL: DB_URL });
    const guaranteed = runJob(name, full).spec.template.spec;
    expect(qosClassOf(guaranteed)).toBe('Guaranteed');
    expect(restrictedViolations(guaranteed)).toEqual([]);
  });

  it.each(['default', 'data', 'http'])('%s: pod passes Pod Security restricted (with its deps init container)', (name) => {
    const pod = runJob(name).spec.template.spec;
    expect(restrictedViolations(pod)).toEqual([]);
    if (jobTypes.get(name)!.requirements.length > 0) expect(pod.initContainers).toHaveLength(1);
  });

  it('every run pod is selected by the default-deny policy; only bridge pods by the egress allow', () => {
    const deny = one(docs, 'NetworkPolicy', 'sandpod-runs-default-deny');
    const bridge = one(docs, 'NetworkPolicy', 'sandpod-runs-bridge-egress');
    for (const name of ['default', 'data', 'http']) {
      const labels = runJob(name).spec.template.metadata.labels as Record<string, string>;
      expect(selects(deny, labels), name).toBe(true);
      expect(selects(bridge, labels), name).toBe(jobTypes.get(name)!.network.mode === 'bridge');
    }
  });

  it('a release’s bridge policy does not select another release’s pods', () => {
    const other = renderOk(withDb(), { release: 'other', namespace: 'other' });
    const bridge = one(other, 'NetworkPolicy', 'other-sandpod-runs-bridge-egress');
    const labels = runJob('http').spec.template.metadata.labels as Record<string, string>;
    expect(selects(bridge, labels)).toBe(false);
    expect(selects(one(other, 'NetworkPolicy', 'other-sandpod-runs-default-deny'), labels)).toBe(true);
  });
});
