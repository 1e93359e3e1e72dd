/**
 * Preflight (issue #13 point 5): the canary Job is a run pod's sandbox running the checks, and the
 * verdict is a pure function of the pod as the informer sees it and the time.
 */
import { spawnSync } from 'node:child_process';
import type { V1Pod } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { buildCanaryJob, CANARY_SCRIPT, parseCanaryReport, preflightVerdict, PREFLIGHT_LABEL } from '../../../../src/runtime/kubernetes/checks/preflight.ts';
import { unknownFields, validateJob } from '../../../support/k8s-schema.ts';
import { testConfig } from '../../../support/kube-runtime.ts';

const report = (checks: Record<string, unknown>) => JSON.stringify({ sandpod_preflight: 1, checks });
const pod = (state: object | undefined): V1Pod => ({ status: { phase: 'Running', containerStatuses: state ? [{ name: 'canary', image: 'x', imageID: '', ready: false, restartCount: 0, state }] : [] } }) as V1Pod;
const terminated = (message: string | undefined, exitCode = 0, reason = 'Completed') => pod({ terminated: { exitCode, reason, message } });

describe('buildCanaryJob', () => {
  const config = testConfig({ kubernetes: { executor_image: 'reg/exec:1', instance: 'blue', runs_namespace: 'runs', preflight: true } });
  const job = buildCanaryJob(config, { name: 'sp-preflight-x', runtimeClassName: 'gvisor' });

  it('is a valid batch/v1 Job with only fields Kubernetes 1.20 knows', () => {
    expect(() => validateJob(job)).not.toThrow();
    expect(unknownFields(job, 'io.k8s.api.batch.v1.Job')).toEqual([]);
  });

  it('runs like a run pod: RuntimeClass, executor image, non-root, no privileges, RuntimeDefault seccomp, read-only root', () => {
    const spec = job.spec!.template.spec!;
    expect(job.metadata).toMatchObject({ name: 'sp-preflight-x', namespace: 'runs', labels: { 'sandpod.io/instance': 'blue', [PREFLIGHT_LABEL]: 'preflight' } });
    expect(job.metadata!.labels!['sandpod.io/execution-id']).toBeUndefined();
    expect(spec.runtimeClassName).toBe('gvisor');
    expect(spec.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 1000, seccompProfile: { type: 'RuntimeDefault' } });
    expect(spec.automountServiceAccountToken).toBe(false);
    const c = spec.containers[0]!;
    expect(c.image).toBe('reg/exec:1');
    expect(c.securityContext).toMatchObject({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
    expect(job.spec!.backoffLimit).toBe(0);
    expect(job.spec!.ttlSecondsAfterFinished).toBeGreaterThan(0);
  });

  it('without a RuntimeClass (permissive, class absent) and without seccomp when it is off', () => {
    const j = buildCanaryJob(testConfig({ enable_seccomp: false }), { name: 'n', runtimeClassName: null });
    expect(j.spec!.template.spec!.runtimeClassName).toBeUndefined();
    expect(j.spec!.template.spec!.securityContext!.seccompProfile).toBeUndefined();
  });
});

describe('the canary script', () => {
  it('passes every check on this machine and prints its report', () => {
    const r = spawnSync('/usr/bin/python3', ['-I', '-c', CANARY_SCRIPT], { encoding: 'utf8', timeout: 30_000 });
    expect(r.status).toBe(0);
    expect(parseCanaryReport(r.stdout)).toEqual({ threads: true, select: true, subprocess: true });
  });

  it.skipIf(process.getuid?.() !== 0)('reports a check that fails with its error (threads refused as an old gVisor does; needs root to drop to another uid)', () => {
    // RLIMIT_NPROC 0 for a non-root uid makes clone() fail: the same symptom as the seccomp bug.
    const r = spawnSync('/usr/bin/python3', ['-c', `import resource, os\nos.setgid(65534); os.setuid(65534)\nresource.setrlimit(resource.RLIMIT_NPROC, (0, 0))\nexec(${JSON.stringify(CANARY_SCRIPT)})`], { encoding: 'utf8', timeout: 30_000 });
    const doc = parseCanaryReport(r.stdout);
    expect(doc?.threads).toMatch(/RuntimeError|can't start new thread|Resource temporarily unavailable/);
    expect(doc?.subprocess).not.toBe(true);
    expect(doc?.select).toBe(true);
  });
});

describe('preflightVerdict', () => {
  it.each([
    ['not seen yet', undefined, 1000, 'running'],
    ['pending', pod({ waiting: { reason: 'ContainerCreating' } }), 1000, 'running'],
    ['running', pod({ running: { startedAt: new Date() } }), 1000, 'running'],
    ['all checks passed', terminated(report({ threads: true, select: true, subprocess: true })), 1000, 'passed'],
    ['threads refused', terminated(report({ threads: "RuntimeError: can't start new thread", select: true, subprocess: true })), 1000, 'failed'],
    ['no report (python missing)', terminated('exec: "python3": not found', 127, 'Error'), 1000, 'failed'],
    ['the sandbox could not start the container', terminated('OCI runtime create failed', 128, 'StartError'), 1000, 'failed'],
    ['image cannot be pulled', pod({ waiting: { reason: 'ImagePullBackOff', message: 'not found' } }), 1000, 'inconclusive'],
    ['never scheduled within the limit', pod(undefined), 200_000, 'inconclusive'],
    ['no pod within the limit', undefined, 200_000, 'inconclusive'],
  ] as const)('%s → %s', (_what, p, elapsed, status) => {
    expect(preflightVerdict(p as V1Pod | undefined, elapsed, 180_000).status).toBe(status);
  });

  it('names every failed check, what it said and where to look', () => {
    const v = preflightVerdict(terminated(report({ threads: "RuntimeError: can't start new thread", select: true, subprocess: 'PermissionError: [Errno 1]' })), 1, 10);
    expect(v.status).toBe('failed');
    if (v.status !== 'failed') return;
    expect(v.reason).toContain("threads failed (RuntimeError: can't start new thread)");
    expect(v.reason).toContain('subprocess failed (PermissionError: [Errno 1])');
    expect(v.reason).not.toContain('select failed');
    expect(v.reason).toMatch(/gVisor.*errnoRet/);
  });

  it('says why it could not tell', () => {
    const v = preflightVerdict(pod({ waiting: { reason: 'ContainerCreating' } }), 181_000, 180_000);
    expect(v).toEqual({ status: 'inconclusive', reason: 'the canary did not finish within 180 s (ContainerCreating)' });
  });

  it.each([
    [undefined, null],
    ['', null],
    ['not json', null],
    ['{"sandpod_preflight": 1}', null],
    ['{"sandpod_preflight": 1, "checks": {}}', null],
    ['noise\n{"sandpod_preflight": 1, "checks": {"threads": true}}', { threads: true }],
    ['{"other": 1, "checks": {"threads": true}}', null],
  ])('parseCanaryReport(%j) → %j', (msg, out) => {
    expect(parseCanaryReport(msg)).toEqual(out);
  });
});
