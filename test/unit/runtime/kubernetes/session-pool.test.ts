/**
 * The Kubernetes session pool's pure parts (issue 19): the pooled session Job (session-pool-plan.ts:
 * a session Job for no session yet, the claim's patches), what a Job and its pod are to the pool, the
 * leader's plan per job type (targets with the demand floor, surplus retired only after waiting, the
 * start budget, stale and failed ones), the claim order, and the demand the cluster shows.
 */
import { describe, expect, it } from 'vitest';
import * as v from 'valibot';
import type { V1Job } from '@kubernetes/client-node';
import { JobTypeConfigSchema, parseConfig } from '../../../../src/config.ts';
import { fromConfig } from '../../../../src/jobtypes/job-type.ts';
import { SESSION_DEADLINE_SLACK_SEC, SESSION_LABELS, sessionJob } from '../../../../src/runtime/kubernetes/session/session-job.ts';
import { lastOpenedByType, planSessionPools, sessionClaimOrder, sessionPoolMemberOf, type SessionPoolMember } from '../../../../src/runtime/kubernetes/session/session-pool-decide.ts';
import { SESSION_CLAIMED_AT, SESSION_POOL_LABELS, sessionClaimJobPatch, sessionClaimPodPatch, sessionPoolJob } from '../../../../src/runtime/kubernetes/session/session-pool-plan.ts';
import { makePod } from '../../../support/kube-builders.ts';
import { validateJob } from '../../../support/k8s-schema.ts';

const config = parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test' } }, {});
const jt = (over: Record<string, unknown> = {}) => fromConfig(v.parse(JobTypeConfigSchema, { name: 'default', memory_limit: '256m', ...over }));
const opts = { name: 'sps-p-0123456789ab', runtimeClassName: 'gvisor', sources: 'sandpod-runner-0123456789abcdef' };
const T0 = Date.parse('2026-12-02T10:00:00Z');

describe('sessionPoolJob', () => {
  it('is a session Job for no session: same pod as a cold session of the type, no session-id label, a name of its own', () => {
    const { job, specHash } = sessionPoolJob(jt(), config, opts);
    validateJob(job);
    expect(job.metadata?.name).toBe('sps-p-0123456789ab');
    for (const labels of [job.metadata?.labels, job.spec?.template.metadata?.labels]) {
      expect(labels?.[SESSION_LABELS.sessionId]).toBeUndefined();
      expect(labels?.[SESSION_POOL_LABELS.pool]).toBe('default');
      expect(labels?.[SESSION_POOL_LABELS.specHash]).toBe(specHash);
    }
    const cold = sessionJob(jt(), config, { ...opts, sessionId: '0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9', requirements: [], lifetimeSec: 600 });
    // The pod is the cold session's: same containers, volumes, security, RuntimeClass.
    expect(job.spec?.template.spec).toEqual(cold.spec?.template.spec);
    expect(job.spec?.template.spec?.containers.find((c) => c.name === 'main')?.volumeMounts).toEqual(
      expect.arrayContaining([{ name: 'code', mountPath: '/code', readOnly: true }, { name: 'input', mountPath: '/input', readOnly: true }]),
    );
    // The spec hash ignores the name, follows the pod.
    expect(sessionPoolJob(jt(), config, { ...opts, name: 'sps-p-other' }).specHash).toBe(specHash);
    expect(sessionPoolJob(jt({ memory_limit: '512m' }), config, opts).specHash).not.toBe(specHash);
    expect(sessionPoolJob(jt(), config, { ...opts, sources: 'sandpod-runner-fedcba9876543210' }).specHash).not.toBe(specHash);
  });

  it("a claim: the session id on Job (at its read version) and pod (at the pod's), the session's deadline from now", () => {
    const { job } = sessionPoolJob(jt(), config, opts);
    job.metadata!.resourceVersion = '41';
    job.status = { startTime: new Date(T0 - 90_500) };
    expect(sessionClaimJobPatch(job, 'sid-1', 600, T0)).toEqual([
      { op: 'replace', path: '/metadata/resourceVersion', value: '41' },
      { op: 'add', path: '/metadata/labels/sandpod.io~1session-id', value: 'sid-1' },
      { op: 'add', path: `/metadata/annotations/${SESSION_CLAIMED_AT.replace('/', '~1')}`, value: String(T0) },
      { op: 'replace', path: '/spec/activeDeadlineSeconds', value: 91 + 600 + SESSION_DEADLINE_SLACK_SEC },
    ]);
    expect(sessionClaimPodPatch('7', 'sid-1')).toEqual([
      { op: 'replace', path: '/metadata/resourceVersion', value: '7' },
      { op: 'add', path: '/metadata/labels/sandpod.io~1session-id', value: 'sid-1' },
    ]);
  });
});

const podReady = () => makePod('sps-p-a-x1').mainRunning(T0).running('collector', T0).phase('Running').obj();
const jobOf = (labels: Record<string, string>, extra: Partial<V1Job['metadata']> = {}): V1Job => ({ metadata: { name: 'sps-p-a', labels, creationTimestamp: new Date(T0) as unknown as Date, ...extra } });

describe('sessionPoolMemberOf', () => {
  const cases: { name: string; job: V1Job; pod: ReturnType<typeof podReady> | undefined; want: Partial<SessionPoolMember> | null }[] = [
    { name: 'a Job without the pool label is none of the pool', job: jobOf({ [SESSION_LABELS.sessionId]: 's' }), pod: podReady(), want: null },
    { name: 'ready: collector and main run', job: jobOf({ [SESSION_POOL_LABELS.pool]: 'default', [SESSION_POOL_LABELS.specHash]: 'h' }), pod: podReady(), want: { ready: true, claimed: false, failed: false, specHash: 'h', jobType: 'default' } },
    { name: 'starting: no pod yet', job: jobOf({ [SESSION_POOL_LABELS.pool]: 'default' }), pod: undefined, want: { ready: false, failed: false } },
    { name: 'claimed: a session id on the Job', job: jobOf({ [SESSION_POOL_LABELS.pool]: 'default', [SESSION_LABELS.sessionId]: 's' }, { annotations: { [SESSION_CLAIMED_AT]: String(T0) } }), pod: podReady(), want: { claimed: true, claimedAt: T0 } },
    { name: 'failed: its pod ended', job: jobOf({ [SESSION_POOL_LABELS.pool]: 'default' }), pod: makePod('p').phase('Failed').obj(), want: { ready: false, failed: true } },
    { name: 'failed: an image that cannot be pulled', job: jobOf({ [SESSION_POOL_LABELS.pool]: 'default' }), pod: makePod('p').waiting('main', 'ImagePullBackOff').obj(), want: { ready: false, failed: true } },
    { name: 'deleting', job: jobOf({ [SESSION_POOL_LABELS.pool]: 'default' }, { deletionTimestamp: new Date(T0) as unknown as Date }), pod: podReady(), want: { ready: false, deleting: true } },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const m = sessionPoolMemberOf(c.job, c.pod);
      if (c.want === null) expect(m).toBeNull();
      else expect(m).toMatchObject(c.want);
    });
  }
});

const member = (name: string, over: Partial<SessionPoolMember> = {}): SessionPoolMember => ({ name, jobType: 'default', specHash: 'h', createdAt: T0, ready: true, claimed: false, deleting: false, failed: false, ...over });
const IDLE = 300_000;

describe('planSessionPools', () => {
  const cases: { name: string; wants: { jobType: string; target: number; specHash: string }[]; members: SessionPoolMember[]; now?: number; hold?: Map<string, number>; maxStarting?: number; create: { jobType: string; count: number }[]; remove: string[] }[] = [
    { name: 'an empty pool of target 1 starts one', wants: [{ jobType: 'default', target: 1, specHash: 'h' }], members: [], create: [{ jobType: 'default', count: 1 }], remove: [] },
    { name: 'one starting counts: nothing more', wants: [{ jobType: 'default', target: 1, specHash: 'h' }], members: [member('a', { ready: false })], create: [], remove: [] },
    { name: 'a claimed one is not the pool\'s: refilled at once', wants: [{ jobType: 'default', target: 1, specHash: 'h' }], members: [member('a', { claimed: true })], create: [{ jobType: 'default', count: 1 }], remove: [] },
    { name: 'up to the target they stay however long they wait', wants: [{ jobType: 'default', target: 1, specHash: 'h' }], members: [member('a')], now: T0 + 10 * IDLE, create: [], remove: [] },
    { name: 'surplus waits out the idle time', wants: [{ jobType: 'default', target: 0, specHash: 'h' }], members: [member('a')], now: T0 + IDLE - 1, create: [], remove: [] },
    { name: 'surplus past the idle time is retired, oldest first', wants: [{ jobType: 'default', target: 1, specHash: 'h' }], members: [member('b', { createdAt: T0 + 1 }), member('a')], now: T0 + IDLE + 5, create: [], remove: ['a'] },
    { name: 'a type no longer pooled (gone, or proxied): removed at once', wants: [], members: [member('a')], create: [], remove: ['a'] },
    { name: 'stale spec: removed and replaced', wants: [{ jobType: 'default', target: 1, specHash: 'h2' }], members: [member('a')], create: [{ jobType: 'default', count: 1 }], remove: ['a'] },
    { name: 'failed: removed, replaced after the back-off only', wants: [{ jobType: 'default', target: 1, specHash: 'h' }], members: [member('a', { ready: false, failed: true })], hold: new Map([['default', T0 + 1000]]), create: [], remove: ['a'] },
    {
      name: 'the start budget is shared by all types, in name order',
      wants: [
        { jobType: 'b', target: 2, specHash: 'h' },
        { jobType: 'a', target: 2, specHash: 'h' },
      ],
      members: [member('x', { jobType: 'b', ready: false })],
      maxStarting: 2,
      create: [{ jobType: 'a', count: 1 }],
      remove: [],
    },
    { name: 'claimed and deleting ones are never removed', wants: [{ jobType: 'default', target: 0, specHash: 'h' }], members: [member('a', { claimed: true }), member('b', { deleting: true })], now: T0 + 2 * IDLE, create: [], remove: [] },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const plan = planSessionPools(c.wants, c.members, c.now ?? T0, { idleMs: IDLE, maxStarting: c.maxStarting ?? 2, ...(c.hold ? { holdUntil: c.hold } : {}) });
      expect(plan.create).toEqual(c.create);
      expect(plan.remove.map((r) => r.name)).toEqual(c.remove);
    });
  }
});

describe('sessionClaimOrder and lastOpenedByType', () => {
  it('claims only ready, unclaimed pods of the type and spec, oldest first', () => {
    const members = [member('new', { createdAt: T0 + 5 }), member('old'), member('taken', { claimed: true }), member('stale', { specHash: 'x' }), member('other', { jobType: 't2' }), member('booting', { ready: false })];
    expect(sessionClaimOrder(members, 'default', 'h')).toEqual(['old', 'new']);
  });

  it('the last open per type: claim time of claimed pooled Jobs, creation of cold session Jobs; unclaimed ones are no demand', () => {
    const at = (ms: number) => new Date(ms) as unknown as Date;
    const jobs: V1Job[] = [
      { metadata: { name: 'sps-p-1', labels: { 'sandpod.io/job-type': 'a', [SESSION_LABELS.sessionId]: 's1' }, annotations: { [SESSION_CLAIMED_AT]: String(T0 + 50) }, creationTimestamp: at(T0) } },
      { metadata: { name: 'sps-s2', labels: { 'sandpod.io/job-type': 'a', [SESSION_LABELS.sessionId]: 's2' }, creationTimestamp: at(T0 + 20) } },
      { metadata: { name: 'sps-s3', labels: { 'sandpod.io/job-type': 'b', [SESSION_LABELS.sessionId]: 's3' }, creationTimestamp: at(T0 + 7000) } },
      { metadata: { name: 'sps-p-4', labels: { 'sandpod.io/job-type': 'c', [SESSION_POOL_LABELS.pool]: 'c' }, creationTimestamp: at(T0 + 9000) } },
    ];
    expect(Object.fromEntries(lastOpenedByType(jobs, 'sandpod.io/job-type'))).toEqual({ a: T0 + 50, b: T0 + 7000 });
  });
});
