import { describe, expect, it } from 'vitest';
import * as v from 'valibot';
import { JobTypeConfigSchema, parseConfig } from '../../../../src/config.ts';
import { fromConfig } from '../../../../src/jobtypes/job-type.ts';
import { buildJob, jobDeadlineSeconds, ownSecret, runResources, toCpuQuantity, toQuantity } from '../../../../src/runtime/kubernetes/runs/build-job.ts';
import { secretForJob } from '../../../../src/runtime/kubernetes/runs/run-objects.ts';
import { jobTypeFromResource } from '../../../../src/jobtypes/kubernetes-registry.ts';
import { qosClassOf } from '../../../support/fake-kube/qos.ts';
import { executionLabel, jobNameFor } from '../../../../src/runtime/kubernetes/names.ts';
import type { RunSpec } from '../../../../src/runtime/runtime.ts';
import { JOB_SPEC_FIELDS_1_20, unknownFields, validateJob, validateSecret } from '../../../support/k8s-schema.ts';
import { verifyEgressToken } from '../../../../src/egress/token.ts';

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
const opts = { runtimeClassName: 'gvisor', sources: 'sandpod-runner-0123456789abcdef' };

const dataType = jt({ name: 'data', requirements: ['numpy', 'pandas'], memory_limit: '1g', cpu_limit: 2, timeout: 60 });
const httpType = jt({ name: 'http', network: { mode: 'bridge', allowed_hosts: ['api.github.com'] }, env: { API_BASE: 'https://api.github.com', 'bad-name': 'x' } });

const EGRESS_KEY = 'a-test-key-of-at-least-thirty-two-bytes';
const EGRESS_NOW = Date.UTC(2026, 10, 24, 1, 0, 0);
const proxyConfig = parseConfig(
  { runtime: 'kubernetes', kubernetes: { executor_image: 'ghcr.io/sandpod/executor:0.1.0', egress_proxy: { url: 'http://sandpod-egress.sandpod.svc:3128', key_file: '/etc/sandpod/egress/key' } } },
  {},
);
/** The runner's `--env` pairs of a Job's main container. */
const runnerEnv = (job: { spec?: any }): Record<string, string> => {
  const cmd: string[] = job.spec.template.spec.containers[0].command;
  const out: Record<string, string> = {};
  cmd.forEach((a, i) => {
    if (a === '--env') {
      const kv = cmd[i + 1]!;
      out[kv.slice(0, kv.indexOf('='))] = kv.slice(kv.indexOf('=') + 1);
    }
  });
  return out;
};

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
  {
    name: 'http-bridge-egress-proxy',
    s: spec({ jobType: httpType }),
    t: httpType,
    o: { ...opts, egressProxy: { key: EGRESS_KEY, nowMs: EGRESS_NOW } },
    c: proxyConfig,
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
    // Requests are a fraction of the limits by default (issue #10 §3, below).
    expect(main.resources).toEqual({
      requests: { cpu: '250m', memory: '256Mi', 'ephemeral-storage': '256Mi' },
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

  it('with the egress proxy configured, bridge types with allowed_hosts get the proxy env with a credential for this run', () => {
    const { job } = buildJob(spec({ jobType: httpType }), httpType, proxyConfig, { ...opts, egressProxy: { key: EGRESS_KEY, nowMs: EGRESS_NOW } });
    expect(job.spec!.template.metadata!.labels!['sandpod.io/egress']).toBe('proxy');
    expect(job.spec!.template.metadata!.labels!['sandpod.io/network']).toBe('bridge');
    const env = runnerEnv(job);
    expect(env.NO_PROXY).toBe('');
    expect(env.no_proxy).toBe('');
    const url = new URL(env.HTTP_PROXY!);
    for (const k of ['HTTPS_PROXY', 'http_proxy', 'https_proxy']) expect(env[k]).toBe(env.HTTP_PROXY);
    expect(url.host).toBe('sandpod-egress.sandpod.svc:3128');
    expect(decodeURIComponent(url.username)).toBe(spec().executionId);
    const deadlineMs = EGRESS_NOW + jobDeadlineSeconds(spec(), proxyConfig.kubernetes.deadline_grace_seconds) * 1000;
    const v = verifyEgressToken(url.password, EGRESS_KEY, deadlineMs);
    expect(v).toEqual({ grant: { executionId: spec().executionId, allowedHosts: ['api.github.com'], expiresAtMs: expect.any(Number) } });
    // Valid through the Job's deadline, not for ever.
    expect(verifyEgressToken(url.password, EGRESS_KEY, deadlineMs + 3600_000)).toEqual({ refused: 'expired' });
  });

  it('the proxy env beats a job type env of the same name', () => {
    const t = jt({ name: 'sneaky', network: { mode: 'bridge', allowed_hosts: ['pypi.org'] }, env: { HTTP_PROXY: 'http://elsewhere:1' } });
    const { job } = buildJob(spec({ jobType: t }), t, proxyConfig, { ...opts, egressProxy: { key: EGRESS_KEY, nowMs: EGRESS_NOW } });
    const cmd = job.spec!.template.spec!.containers[0]!.command!;
    const proxyArg = cmd.findLastIndex((a) => a.startsWith('HTTP_PROXY='));
    // The runner applies --env pairs in order: the last one is what the program sees.
    expect(cmd.indexOf('HTTP_PROXY=http://elsewhere:1')).toBeGreaterThan(0);
    expect(cmd.indexOf('HTTP_PROXY=http://elsewhere:1')).toBeLessThan(proxyArg);
    expect(new URL(cmd[proxyArg]!.slice('HTTP_PROXY='.length)).host).toBe('sandpod-egress.sandpod.svc:3128');
  });

  it.each([
    ['no proxy configured', httpType, config, { key: EGRESS_KEY, nowMs: EGRESS_NOW }],
    ['proxy configured but no key given', httpType, proxyConfig, null],
    ['network none', jt(), proxyConfig, { key: EGRESS_KEY, nowMs: EGRESS_NOW }],
    ['bridge without allowed_hosts', jt({ name: 'open', network: { mode: 'bridge' } }), proxyConfig, { key: EGRESS_KEY, nowMs: EGRESS_NOW }],
  ])('no proxy env nor egress label: %s', (_name, t, c, egressProxy) => {
    const { job } = buildJob(spec({ jobType: t }), t, c, { ...opts, egressProxy });
    expect(job.spec!.template.metadata!.labels!['sandpod.io/egress']).toBeUndefined();
    expect(Object.keys(runnerEnv(job)).filter((k) => /proxy/i.test(k))).toEqual([]);
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

describe('requests vs limits (issue #10 §3)', () => {
  const podOf = (t = jt(), c = config, requirements: string[] = []) => buildJob(spec({ jobType: t, requirements }), t, c, opts).job.spec!.template.spec! as any;
  const fractions = { cpu: config.kubernetes.cpu_request_fraction, memory: config.kubernetes.memory_request_fraction };

  it('documented defaults: a run requests 0.25 of its CPU limit and 0.5 of its memory limit', () => {
    expect(fractions).toEqual({ cpu: 0.25, memory: 0.5 });
  });

  // [what, job type fields, fractions, requests, limits, guaranteed]
  const table: [string, Record<string, unknown>, { cpu: number; memory: number }, { cpu: string; memory: string }, { cpu: string; memory: string }, boolean][] = [
    ['default type, default fractions', {}, fractions, { cpu: '250m', memory: '256Mi' }, { cpu: '1000m', memory: '512Mi' }, false],
    ['data type (2 CPUs, 1g)', { cpu_limit: 2, memory_limit: '1g' }, fractions, { cpu: '500m', memory: '512Mi' }, { cpu: '2000m', memory: '1Gi' }, false],
    ['explicit requests', { cpu_limit: 2, cpu_request: 0.1, memory_limit: '1g', memory_request: '200m' }, fractions, { cpu: '100m', memory: '200Mi' }, { cpu: '2000m', memory: '1Gi' }, false],
    ['requests equal to limits: Guaranteed', { cpu_limit: 0.5, cpu_request: 0.5, memory_limit: '256m', memory_request: '256Mi' }, fractions, { cpu: '500m', memory: '256Mi' }, { cpu: '500m', memory: '256Mi' }, true],
    ['fractions of 1: Guaranteed', {}, { cpu: 1, memory: 1 }, { cpu: '1000m', memory: '512Mi' }, { cpu: '1000m', memory: '512Mi' }, true],
    ['only the CPU request equal: not Guaranteed', { cpu_request: 1 }, fractions, { cpu: '1000m', memory: '256Mi' }, { cpu: '1000m', memory: '512Mi' }, false],
    ['a tiny limit never requests 0', { cpu_limit: 0.01, memory_limit: '1k' }, { cpu: 0.01, memory: 0.001 }, { cpu: '1m', memory: '1' }, { cpu: '10m', memory: '1Ki' }, false],
    ['an odd limit is not rounded to MiB', { memory_limit: '1000000' }, fractions, { cpu: '250m', memory: '500000' }, { cpu: '1000m', memory: '1000000' }, false],
  ];
  it.each(table)('%s', (_what, fields, f, requests, limits, guaranteed) => {
    expect(runResources(jt(fields), f)).toEqual({ requests, limits, guaranteed });
  });

  it('the pod is Burstable by default (main, deps and the collector request less than their limits)', () => {
    const pod = podOf(jt(), config, ['numpy']);
    expect(qosClassOf(pod)).toBe('Burstable');
    const [main, collector] = pod.containers;
    expect(main.resources).toEqual({ requests: { cpu: '250m', memory: '256Mi', 'ephemeral-storage': '256Mi' }, limits: { cpu: '1000m', memory: '512Mi', 'ephemeral-storage': '256Mi' } });
    expect(pod.initContainers[0].resources.requests).toMatchObject({ cpu: '250m', memory: '256Mi' });
    expect(collector.resources.requests).toMatchObject({ cpu: '10m', memory: '32Mi' });
    expect(collector.resources.limits).toMatchObject({ cpu: '100m', memory: '64Mi' });
    // What a default run reserves on a node: about a quarter of a CPU, so a 2-CPU node holds several.
    const reservedMilli = pod.containers.reduce((n: number, c: any) => n + parseInt(c.resources.requests.cpu, 10), 0);
    expect(reservedMilli).toBe(260);
  });

  it('requests equal to limits give a Guaranteed pod, with and without the deps init container', () => {
    const t = jt({ cpu_request: 1, memory_request: '512m' });
    for (const reqs of [[], ['numpy']]) {
      const pod = podOf(t, config, reqs);
      expect(qosClassOf(pod)).toBe('Guaranteed');
      for (const c of [...(pod.initContainers ?? []), ...pod.containers]) expect(c.resources.requests).toEqual(c.resources.limits);
    }
    // So do fractions of 1 in the service config.
    const full = parseConfig({ runtime: 'kubernetes', kubernetes: { cpu_request_fraction: 1, memory_request_fraction: 1 } }, {});
    expect(qosClassOf(podOf(jt(), full))).toBe('Guaranteed');
  });

  it('the QoS rule the fake applies is the API server\'s (BestEffort, Burstable, Guaranteed, a limit without a request)', () => {
    const c = (resources?: object) => ({ ...(resources ? { resources } : {}) });
    expect(qosClassOf({ containers: [c(), c()] })).toBe('BestEffort');
    expect(qosClassOf({ containers: [c({ limits: { cpu: '1', memory: '1Gi' } })] })).toBe('Guaranteed');
    expect(qosClassOf({ containers: [c({ requests: { cpu: '1000m', memory: '1024Mi' }, limits: { cpu: '1', memory: '1Gi' } })] })).toBe('Guaranteed');
    expect(qosClassOf({ containers: [c({ limits: { cpu: '1', memory: '1Gi' } }), c()] })).toBe('Burstable');
    expect(qosClassOf({ containers: [c({ requests: { cpu: '500m', memory: '1Gi' }, limits: { cpu: '1', memory: '1Gi' } })] })).toBe('Burstable');
    expect(qosClassOf({ initContainers: [c({ requests: { cpu: '1m' } })], containers: [c({ limits: { cpu: '1', memory: '1Gi' } })] })).toBe('Burstable');
  });

  it('a request above its limit is refused, naming the field: config file and JobType resource alike', () => {
    expect(v.safeParse(JobTypeConfigSchema, { name: 'x', cpu_limit: 1, cpu_request: 1.5 }).success).toBe(false);
    expect(() => parseConfig({ job_types: [{ name: 'x', memory_limit: '256m', memory_request: '1g' }] }, {})).toThrow(/memory_request.*must not exceed memory_limit/);
    expect(() => parseConfig({ job_types: [{ name: 'x', cpu_limit: 0.5, cpu_request: 1 }] }, {})).toThrow(/cpu_request.*must not exceed cpu_limit/);
    expect(jobTypeFromResource({ metadata: { name: 'x' }, spec: { cpuLimit: 1, cpuRequest: 2 } })).toMatchObject({ error: expect.stringMatching(/cpu_request.*must not exceed cpu_limit/) });
    const ok = jobTypeFromResource({ metadata: { name: 'x' }, spec: { cpuLimit: 2, cpuRequest: 0.5, memoryLimit: '1g', memoryRequest: '1Gi' } });
    expect(ok).toMatchObject({ cpuRequest: 0.5, memoryRequest: '1Gi' });
  });

  it('requests enter a job type\'s digest only when set (job_ref of existing types unchanged)', () => {
    expect(jt().digest).toBe(jt({}).digest);
    expect(jt({ cpu_request: 0.25 }).digest).not.toBe(jt().digest);
    expect(jt({ memory_request: '256m' }).digest).not.toBe(jt({ memory_request: '128m' }).digest);
  });
});

describe('input files (issue 19)', () => {
  it('ride in the run Secret under keys of their own and appear read-only as /input/files/<name>', () => {
    const files = [
      { name: 'data.csv', data: Buffer.from('a,b\n1,2\n'), sha256: 'x' },
      { name: 'ünï côdé.bin', data: Buffer.from([0, 255]), sha256: 'y' },
    ];
    const { secret, job } = buildJob(spec({ inputFiles: files }), jt(), config, opts);
    validateSecret(secret);
    validateJob(job);
    expect(Buffer.from(secret.data!['file-0']!, 'base64').toString()).toBe('a,b\n1,2\n');
    expect(Buffer.from(secret.data!['file-1']!, 'base64')).toEqual(Buffer.from([0, 255]));
    const input = job.spec!.template.spec!.volumes!.find((v) => v.name === 'input')!;
    expect(input.secret!.items).toEqual([
      { key: 'data.json', path: 'data.json' },
      { key: 'file-0', path: 'files/data.csv' },
      { key: 'file-1', path: 'files/ünï côdé.bin' },
    ]);
    expect(input.secret!.defaultMode).toBe(0o444);
    const main = job.spec!.template.spec!.containers[0]!;
    expect(main.volumeMounts!.find((m) => m.name === 'input')).toMatchObject({ mountPath: '/input', readOnly: true });
  });

  it('a run without files has the Secret and volume it always had', () => {
    const { secret, job } = buildJob(spec(), jt(), config, opts);
    expect(Object.keys(secret.data!).sort()).toEqual(['data.json', 'main.py']);
    expect(job.spec!.template.spec!.volumes!.find((v) => v.name === 'input')!.secret!.items).toEqual([{ key: 'data.json', path: 'data.json' }]);
  });
});

describe('buildJob: the runner', () => {
  it('comes from the runner sources ConfigMap, read-only for everyone, not from the run\'s Secret', () => {
    const { secret, job } = buildJob(spec(), jt(), config, opts);
    const pod = job.spec!.template.spec!;
    expect(pod.volumes!.find((v) => v.name === 'runner')).toEqual({ name: 'runner', configMap: { name: opts.sources, defaultMode: 0o444 } });
    const main = pod.containers.find((c) => c.name === 'main')!;
    expect(main.volumeMounts!.find((m) => m.name === 'runner')).toMatchObject({ mountPath: '/sandpod', readOnly: true });
    expect(main.command).toContain('/sandpod/runner.py');
    expect(Object.keys(secret.data!)).not.toContain('runner.py');
    // The Secret is the run's own bytes: a one-line program and its input.
    expect(JSON.stringify(secret).length).toBeLessThan(1024);
  });
});

describe('secretForJob: an adopted Job of an earlier version', () => {
  it('gets the runner back in its re-created Secret when its pod mounts it from there, and only then', () => {
    const { secret, job } = buildJob(spec(), jt(), config, opts);
    // A Job of this version mounts the runner from the ConfigMap: the Secret stays the run's bytes.
    expect(secretForJob(secret, job, () => 'RUNNER')).toBe(secret);
    const old = structuredClone(job);
    old.spec!.template.spec!.volumes = old.spec!.template.spec!.volumes!.map((v) => (v.name === 'runner' ? { name: 'runner', secret: { secretName: secret.metadata!.name!, items: [{ key: 'runner.py', path: 'runner.py' }] } } : v));
    const back = secretForJob(secret, old, () => 'RUNNER');
    expect(Buffer.from(back.data!['runner.py']!, 'base64').toString()).toBe('RUNNER');
    expect(back.data!['main.py']).toBe(secret.data!['main.py']);
    expect(secret.data!['runner.py']).toBeUndefined();
  });
});
