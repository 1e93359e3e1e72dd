import { describe, expect, it } from 'vitest';
import * as v from 'valibot';
import { JobTypeConfigSchema, parseConfig } from '../../../../src/config.ts';
import { fromConfig } from '../../../../src/jobtypes/job-type.ts';
import { buildJob, jobDeadlineSeconds, ownSecret, toCpuQuantity, toQuantity } from '../../../../src/runtime/kubernetes/build-job.ts';
import { executionLabel, jobNameFor } from '../../../../src/runtime/kubernetes/names.ts';
import type { RunSpec } from '../../../../src/runtime/runtime.ts';
import { JOB_SPEC_FIELDS_1_20, unknownFields, validateJob, validateSecret } from '../../../support/k8s-schema.ts';

const config = parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'ghcr.io/sandpod/executor:0.1.0' } }, {});
const jt = (o: Record<string, unknown> = {}) => fromConfig(v.parse(JobTypeConfigSchema, { name: 'default', ...o }));
const spec = (o: Partial<RunSpec> = {}): RunSpec => ({
  executionId: '3f2b8c1e-6a0d-4e7b-9f35-0c1d2e3f4a5b',
  code: 'print("hello")\n',
  inputJson: '{"x": 1}',
  jobType: jt(),
  timeoutSec: 30,
  startupTimeoutSec: 60,
  requirements: [],
  maxStdoutBytes: 32768,
  maxArtifactBytes: 5242880,
  ...o,
});
const opts = { runtimeClassName: 'gvisor', runnerSource: '# runner.py (stub for snapshots)\n' };

const dataType = jt({ name: 'data', requirements: ['numpy', 'pandas'], memory_limit: '1g', cpu_limit: 2, timeout: 60 });
const httpType = jt({ name: 'http', network: { mode: 'bridge', allowed_hosts: ['api.github.com'] }, env: { API_BASE: 'https://api.github.com', 'bad-name': 'x' } });

const cases = [
  { name: 'default', s: spec(), t: jt(), o: opts, c: config },
  { name: 'data-with-requirements', s: spec({ jobType: dataType, requirements: ['numpy', 'pandas', '--index-url=http://evil'] }), t: dataType, o: opts, c: config },
  {
    name: 'http-bridge-permissive-no-gvisor-no-seccomp',
    s: spec({ jobType: httpType }),
    t: httpType,
    o: { ...opts, runtimeClassName: null },
    c: parseConfig({ runtime: 'kubernetes', enable_seccomp: false, kubernetes: { instance: 'blue' }, pip: { index_url: 'http://10.0.0.5/simple' } }, {}),
  },
];

describe('buildJob', () => {
  it.each(cases)('$name: matches its snapshot and the Kubernetes schemas', async ({ name, s, t, o, c }) => {
    const { job, secret } = buildJob(s, t, c, o);
    validateJob(job);
    validateSecret(secret);
    validateSecret(ownSecret(secret, { metadata: { name: job.metadata!.name!, uid: '0e5f2f5a-0000-4000-8000-000000000001' } }));
    await expect(JSON.stringify({ job, secret }, null, 2) + '\n').toMatchFileSnapshot(`./__snapshots__/build-job.${name}.json`);
  });

  it('the schema check catches what it must (unknown fields, wrong types)', () => {
    const { job } = buildJob(spec(), jt(), config, opts);
    const typo = structuredClone(job) as any;
    typo.spec.template.spec.containers[0].securityContxt = {};
    expect(() => validateJob(typo)).toThrow(/securityContxt/);
    const wrong = structuredClone(job) as any;
    wrong.spec.backoffLimit = 'zero';
    expect(() => validateJob(wrong)).toThrow(/backoffLimit/);
    expect(unknownFields(job, 'V1Job')).toEqual([]);
  });

  it('uses only batch/v1 Job fields that exist since Kubernetes 1.20', () => {
    for (const c of cases) {
      const { job } = buildJob(c.s, c.t, c.c, c.o);
      for (const k of Object.keys(job.spec!)) expect(JOB_SPEC_FIELDS_1_20.has(k), k).toBe(true);
    }
  });

  it('has the Job shape of issue 4: backoff, deadline, TTL, labels, security, no service links, no token', () => {
    const { job, secret } = buildJob(spec(), jt(), config, opts);
    const pod = job.spec!.template.spec!;
    expect(job.spec).toMatchObject({ backoffLimit: 0, activeDeadlineSeconds: 60 + 30 + 30, ttlSecondsAfterFinished: 600 });
    const labels = {
      'app.kubernetes.io/managed-by': 'sandpod',
      'sandpod.io/execution-id': '3f2b8c1e-6a0d-4e7b-9f35-0c1d2e3f4a5b',
      'sandpod.io/job-type': 'default',
      'sandpod.io/instance': 'sandpod',
      'sandpod.io/network': 'none',
    };
    expect(job.metadata!.labels).toEqual(labels);
    expect(job.spec!.template.metadata!.labels).toEqual(labels);
    expect(pod).toMatchObject({
      restartPolicy: 'Never',
      runtimeClassName: 'gvisor',
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      dnsPolicy: 'None',
      securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000, seccompProfile: { type: 'RuntimeDefault' } },
    });
    for (const c of [...(pod.initContainers ?? []), ...pod.containers]) {
      expect(c.securityContext).toMatchObject({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: { drop: ['ALL'] } });
      expect(c.env).toBeUndefined();
      // Every process starts from a clean environment: nothing the kubelet injects reaches user code.
      expect(c.command!.slice(0, 2)).toEqual(c.name === 'collector' ? ['/bin/sh', '-c'] : ['/usr/bin/env', '-i']);
    }
    expect(pod.initContainers).toBeUndefined();
    const main = pod.containers.find((c) => c.name === 'main')!;
    expect(main.command).toEqual(expect.arrayContaining(['python3', '/sandpod/runner.py', '--tee', '--timeout', '30']));
    expect(main.resources).toEqual({
      requests: { cpu: '1000m', memory: '512Mi', 'ephemeral-storage': '256Mi' },
      limits: { cpu: '1000m', memory: '512Mi', 'ephemeral-storage': '256Mi' },
    });
    expect(secret.metadata!.name).toBe(job.metadata!.name);
    expect(Buffer.from(secret.data!['main.py']!, 'base64').toString()).toBe('print("hello")\n');
  });

  it('installs requirements in the deps init container, as arguments after `--`', () => {
    const { job } = buildJob(spec({ requirements: ['numpy', '--index-url=http://evil'] }), jt(), config, opts);
    const deps = job.spec!.template.spec!.initContainers![0]!;
    expect(deps.name).toBe('deps');
    const cmd = deps.command!;
    expect(cmd.slice(-3)).toEqual(['deps', 'numpy', '--index-url=http://evil']);
    expect(cmd.find((a) => a.includes('pip install'))).toMatch(/--target \/deps -- "\$@"$/);
    const main = job.spec!.template.spec!.containers[0]!;
    expect(main.command).toEqual(expect.arrayContaining(['--python-path', '/deps']));
  });

  it('bridge job types get cluster DNS and the bridge label; RuntimeClass only when given', () => {
    const { job } = buildJob(spec({ jobType: httpType }), httpType, config, { ...opts, runtimeClassName: null });
    expect(job.metadata!.labels!['sandpod.io/network']).toBe('bridge');
    expect(job.spec!.template.spec!.dnsPolicy).toBe('ClusterFirst');
    expect(job.spec!.template.spec!.runtimeClassName).toBeUndefined();
    // RLIMIT_NPROC is only safe with a per-pod kernel (gVisor).
    expect(job.spec!.template.spec!.containers[0]!.command!.join(' ')).not.toContain('nproc=');
  });

  it('converts service-style sizes to Kubernetes quantities (512m is 512 MiB, never milli-bytes)', () => {
    expect(toQuantity('512m')).toBe('512Mi');
    expect(toQuantity('1g')).toBe('1Gi');
    expect(toQuantity('1Gi')).toBe('1Gi');
    expect(toQuantity('100k')).toBe('100Ki');
    expect(toQuantity('1000')).toBe('1000');
    expect(toCpuQuantity(0.5)).toBe('500m');
    expect(toCpuQuantity(2)).toBe('2000m');
    expect(jobDeadlineSeconds({ startupTimeoutSec: 0.3, timeoutSec: 1 }, 0)).toBe(2);
  });

  it('derives deterministic, valid names from any execution id', () => {
    for (const id of ['3f2b8c1e-6a0d-4e7b-9f35-0c1d2e3f4a5b', 'ABC_def.1', 'x'.repeat(200), '--weird--', 'é']) {
      const name = jobNameFor(id);
      expect(name).toMatch(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/);
      expect(name.length).toBeLessThanOrEqual(52);
      expect(jobNameFor(id)).toBe(name);
      expect(executionLabel(id)).toMatch(/^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/);
      expect(executionLabel(id).length).toBeLessThanOrEqual(63);
    }
    expect(jobNameFor('a-b')).not.toBe(jobNameFor('a_b'));
  });
});
