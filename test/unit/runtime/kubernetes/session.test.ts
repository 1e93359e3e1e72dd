/**
 * A session's Job (session/session-job.ts) and the pure decisions about its pod
 * (session/session-decide.ts): the run Job's isolation kept (RuntimeClass, security context, limits,
 * read-only /code and /input, no service-account token), the session's own changes, and the table of
 * pod states, OOM kills and collector refusals.
 */
import { describe, expect, it } from 'vitest';
import * as v from 'valibot';
import { JobTypeConfigSchema, parseConfig } from '../../../../src/config.ts';
import { AppError } from '../../../../src/errors.ts';
import { fromConfig } from '../../../../src/jobtypes/job-type.ts';
import { answerError, podEnd, podOom, podSettled, podTrouble } from '../../../../src/runtime/kubernetes/session/session-decide.ts';
import { SESSION_DEADLINE_SLACK_SEC, SESSION_LABELS, sessionJob, sessionJobName } from '../../../../src/runtime/kubernetes/session/session-job.ts';
import { makePod } from '../../../support/kube-builders.ts';
import { validateJob } from '../../../support/k8s-schema.ts';

const config = parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test' } }, {});
const jt = (over: Record<string, unknown> = {}) => fromConfig(v.parse(JobTypeConfigSchema, { name: 'default', memory_limit: '256m', ...over }));
const ID = '0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9';
const build = (over: Partial<Parameters<typeof sessionJob>[2]> = {}, type = jt()) =>
  sessionJob(type, config, { sessionId: ID, name: sessionJobName(ID), runtimeClassName: 'gvisor', sources: 'sandpod-runner-0123456789abcdef', requirements: [], lifetimeSec: 600, ...over });

describe('sessionJob', () => {
  it('is a valid Job with the run Job isolation and the session changes', () => {
    const job = build();
    validateJob(job);
    const pod = job.spec!.template.spec!;
    expect(job.metadata?.name).toBe(`sps-${ID}`);
    expect(job.metadata?.labels?.[SESSION_LABELS.sessionId]).toBe(ID);
    expect(job.spec!.template.metadata?.labels?.[SESSION_LABELS.sessionId]).toBe(ID);
    expect(job.metadata?.labels?.['sandpod.io/execution-id']).toBeUndefined();
    expect(job.spec?.activeDeadlineSeconds).toBe(600 + SESSION_DEADLINE_SLACK_SEC);
    expect(pod).toMatchObject({ runtimeClassName: 'gvisor', automountServiceAccountToken: false, enableServiceLinks: false, restartPolicy: 'Never', securityContext: { runAsNonRoot: true, runAsUser: 1000 } });
    const main = pod.containers.find((c) => c.name === 'main')!;
    const collector = pod.containers.find((c) => c.name === 'collector')!;
    expect(main.securityContext).toMatchObject({ readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } });
    expect(main.resources?.limits?.memory).toBe('256Mi');
    expect(main.volumeMounts).toEqual(
      expect.arrayContaining([
        { name: 'code', mountPath: '/code', readOnly: true },
        { name: 'input', mountPath: '/input', readOnly: true },
        { name: 'workspace', mountPath: '/workspace' },
      ]),
    );
    // Runner and collector come from the runner sources ConfigMap, read-only in both containers.
    for (const c of [main, collector]) expect(c.volumeMounts).toContainEqual({ name: 'runner', mountPath: '/sandpod', readOnly: true });
    expect(pod.volumes?.find((vol) => vol.name === 'runner')).toEqual({ name: 'runner', configMap: { name: 'sandpod-runner-0123456789abcdef', defaultMode: 0o444 } });
    const cmd = main.command!;
    expect(cmd.slice(0, 2)).toEqual(['/usr/bin/env', '-i']);
    expect(cmd).not.toContain('-c');
    expect(cmd[cmd.indexOf('/sandpod/runner.py') + 1]).toBeDefined();
    expect(cmd).toEqual(expect.arrayContaining(['--session', '--go-port']));
    expect(cmd[cmd.indexOf('--cwd') + 1]).toBe('/workspace');
    expect(cmd.filter((a) => a === '--cwd')).toHaveLength(1);
    for (const gone of ['--timeout', '--max-stream-bytes', '--tee', '--wait', '--ready-listen']) expect(cmd, gone).not.toContain(gone);
    expect(main.startupProbe).toBeUndefined();
    expect(collector).toMatchObject({ stdin: true, stdinOnce: false });
    expect(collector.command).toContain('/sandpod/session-collector.py');
    expect(collector.command).not.toContain('-c');
    // A few KB: no text of the runner or the collector in the Job.
    expect(JSON.stringify(job).length).toBeLessThan(12_000);
    expect(collector.securityContext).toMatchObject({ readOnlyRootFilesystem: true, runAsUser: 1000 });
    // No Secret is needed: no volume names one.
    expect(pod.volumes?.some((vol) => vol.secret)).toBe(false);
    expect(pod.volumes?.find((vol) => vol.name === 'workspace')).toEqual({ name: 'workspace', emptyDir: {} });
  });

  it('installs requirements in deps; a network-none type gets no resolver; no RuntimeClass only when given none', () => {
    const withDeps = build({ requirements: ['six==1.16.0'] });
    const init = withDeps.spec!.template.spec!.initContainers!;
    expect(init.map((c) => c.name)).toEqual(['deps']);
    expect(init[0]!.command).toContain('six==1.16.0');
    expect(withDeps.spec!.template.spec!.containers.find((c) => c.name === 'main')!.command).toEqual(expect.arrayContaining(['--python-path', '/deps']));
    const none = build({}, jt({ network: { mode: 'none', allowed_hosts: [] } }));
    expect(build({}, jt({ network: { mode: 'bridge', allowed_hosts: [] } })).spec!.template.spec!.dnsPolicy).toBe('ClusterFirst');
    expect(none.spec!.template.spec!.dnsPolicy).toBe('None');
    expect(none.metadata?.labels?.['sandpod.io/network']).toBe('none');
    expect(build({ runtimeClassName: null }).spec!.template.spec!.runtimeClassName).toBeUndefined();
  });
});

describe('session pod decisions', () => {
  const t = 1_700_000_000_000;
  it.each([
    ['absent', undefined, 'absent'],
    ['pending', makePod().obj(), 'starting'],
    ['collector running', makePod().running('main', t).running('collector', t).obj(), 'attachable'],
    ['main ended', makePod().running('collector', t).terminated('main', 1, 'Error', t, t).obj(), 'ended'],
    ['image pull error', makePod().waiting('main', 'ImagePullBackOff', 'nope').obj(), 'ended'],
    ['deleting', makePod().running('main', t).running('collector', t).deleting().obj(), 'gone'],
    ['failed', makePod().phase('Failed').obj(), 'ended'],
  ] as const)('%s → %s', (_n, pod, want) => {
    expect(podEnd(pod)).toBe(want);
  });

  it.each([
    ['absent', undefined, true],
    ['both running', makePod().running('main', t).running('collector', t).obj(), false],
    // The kubelet reports containers one at a time: the other's end (an OOMKilled, maybe) is still to come.
    ['collector ended, main still running', makePod().running('main', t).terminated('collector', 137, 'Error', t, t).obj(), false],
    ['main killed (137), collector still running', makePod().running('collector', t).terminated('main', 137, 'Error', t, t).obj(), false],
    ['main exited 1 by itself, collector still running', makePod().running('collector', t).terminated('main', 1, 'Error', t, t).obj(), true],
    ['both ended', makePod().terminated('main', 137, 'Error', t, t).terminated('collector', 0, 'Completed', t, t).obj(), true],
    ['phase Failed', makePod().phase('Failed').obj(), true],
    ['deleting', makePod().running('main', t).running('collector', t).deleting().obj(), true],
    ['image pull error', makePod().waiting('main', 'ImagePullBackOff', 'nope').obj(), true],
  ] as const)('settled: %s → %s', (_n, pod, want) => {
    expect(podSettled(pod)).toBe(want);
  });

  it('tells an OOM kill from other ends', () => {
    expect(podOom(makePod().running('collector', t).terminated('main', 137, 'OOMKilled', t, t).obj())).toBe(true);
    expect(podOom(makePod().terminated('main', 137, 'Error', t, t).terminated('collector', 137, 'OOMKilled', t, t).obj())).toBe(true);
    expect(podOom(makePod().terminated('main', 0, 'Completed', t, t).terminated('collector', 0, 'Completed', t, t).obj())).toBe(false);
    expect(podOom(makePod().terminated('main', 137, 'Error', t, t).terminated('collector', 0, 'Completed', t, t).obj())).toBe(false);
    expect(podOom(undefined)).toBe(false);
    expect(podTrouble(makePod().waiting('main', 'ErrImagePull', 'not found').obj())).toBe('main: ErrImagePull: not found');
  });

  it.each([
    [{ ok: false, code: 'not_found', message: 'no file' }, 404],
    [{ ok: false, code: 'conflict', message: 'a link' }, 409],
    [{ ok: false, code: 'payload_too_large', message: 'big' }, 413],
    [{ ok: false, code: 'bad_request', message: 'name' }, 400],
    [{ ok: false, code: 'internal_error', message: 'x' }, 409],
    [{ ok: false }, 409],
  ])('collector refusal %j → %i', (reply, status) => {
    const err = answerError(reply);
    expect(err).toBeInstanceOf(AppError);
    expect(err.status).toBe(status);
  });
});
