/** The warm pool's pure decisions (pool-decide.ts) and Jobs (pool-plan.ts), as tables with an explicit clock. */
import { describe, expect, it } from 'vitest';
import type { V1Job } from '@kubernetes/client-node';
import { CLAIMED_AT, GO_PORT, POD_IP_ENV, READY_PORT, poolable, claimJobPatch, coldAttachJob, poolJob } from '../../../../src/runtime/kubernetes/pool/pool-plan.ts';
import { claimOrder, memberOf, planPool, poolBackoffMs, type PoolMember } from '../../../../src/runtime/kubernetes/pool/pool-decide.ts';
import { afterHandOverFailure, decide, newRunState } from '../../../../src/runtime/kubernetes/runs/decide.ts';
import { BUILT_SITE_DIR, buildJob } from '../../../../src/runtime/kubernetes/runs/build-job.ts';
import { jobType, testConfig } from '../../../support/kube-runtime.ts';
import type { JobType } from '../../../../src/jobtypes/job-type.ts';

const T0 = 1_000_000;
const m = (name: string, over: Partial<PoolMember> = {}): PoolMember => ({ name, jobType: 'a', specHash: 'h1', createdAt: T0, ready: true, claimed: false, deleting: false, failed: false, ...over });
const opts = { maxIdleMs: 60_000, maxStarting: 2 };

describe('planPool', () => {
  const cases: { name: string; wants: { jobType: string; size: number; specHash: string }[]; members: PoolMember[]; now?: number; create: { jobType: string; count: number }[]; remove: [string, string][] }[] = [
    { name: 'empty pool fills, at most maxStarting at once', wants: [{ jobType: 'a', size: 3, specHash: 'h1' }], members: [], create: [{ jobType: 'a', count: 2 }], remove: [] },
    { name: 'starting members count against maxStarting', wants: [{ jobType: 'a', size: 3, specHash: 'h1' }], members: [m('p1', { ready: false })], create: [{ jobType: 'a', count: 1 }], remove: [] },
    { name: 'full pool does nothing', wants: [{ jobType: 'a', size: 2, specHash: 'h1' }], members: [m('p1'), m('p2')], create: [], remove: [] },
    { name: 'claimed members leave the pool: refill', wants: [{ jobType: 'a', size: 2, specHash: 'h1' }], members: [m('p1'), m('p2', { claimed: true })], create: [{ jobType: 'a', count: 1 }], remove: [] },
    { name: 'stale spec hash is replaced', wants: [{ jobType: 'a', size: 1, specHash: 'h2' }], members: [m('p1')], create: [{ jobType: 'a', count: 1 }], remove: [['p1', 'stale']] },
    { name: 'JobType gone removes its pool', wants: [], members: [m('p1'), m('p2', { claimed: true })], create: [], remove: [['p1', 'jobtype-gone']] },
    { name: 'size 0 removes the pool', wants: [{ jobType: 'a', size: 0, specHash: 'h1' }], members: [m('p1')], create: [], remove: [['p1', 'jobtype-gone']] },
    { name: 'idle past the limit is replaced', wants: [{ jobType: 'a', size: 1, specHash: 'h1' }], members: [m('p1')], now: T0 + 60_000, create: [{ jobType: 'a', count: 1 }], remove: [['p1', 'idle']] },
    { name: 'idle just under the limit stays', wants: [{ jobType: 'a', size: 1, specHash: 'h1' }], members: [m('p1')], now: T0 + 59_999, create: [], remove: [] },
    { name: 'failed pods are replaced', wants: [{ jobType: 'a', size: 1, specHash: 'h1' }], members: [m('p1', { failed: true, ready: false })], create: [{ jobType: 'a', count: 1 }], remove: [['p1', 'failed']] },
    { name: 'excess: the newest go (same choice on every replica)', wants: [{ jobType: 'a', size: 1, specHash: 'h1' }], members: [m('p2', { createdAt: T0 + 5 }), m('p1'), m('p3', { createdAt: T0 + 5 })], create: [], remove: [['p2', 'excess'], ['p3', 'excess']] },
    { name: 'deleting members are ignored', wants: [{ jobType: 'a', size: 1, specHash: 'h1' }], members: [m('p1', { deleting: true })], create: [{ jobType: 'a', count: 1 }], remove: [] },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const plan = planPool(c.wants, c.members, c.now ?? T0 + 1, opts);
      expect(plan.create).toEqual(c.create);
      expect(plan.remove.map((r) => [r.name, r.reason])).toEqual(c.remove);
    });
  }
});

describe("planPool: a claimed pod's refill waits for its run", () => {
  const want = [{ jobType: 'a', size: 2, specHash: 'h1' }];
  const delay = { ...opts, refillDelayMs: 3000 };
  const claimed = (over: Partial<PoolMember> = {}) => m('p2', { claimed: true, claimedAt: T0, ...over });
  it.each([
    ['run going on, one pod still ready: no refill yet', [m('p1'), claimed()], T0 + 100, 0],
    ['the delay is over: refill', [m('p1'), claimed()], T0 + 3000, 1],
    ['the run is over (its pod ended): refill', [m('p1'), claimed({ failed: true })], T0 + 100, 1],
    ['the run is over (known here: no claim time): refill', [m('p1'), m('p2', { claimed: true })], T0 + 100, 1],
    ['its Job is being deleted: refill', [m('p1'), claimed({ deleting: true })], T0 + 100, 1],
    ['nothing ready left: refill at once', [m('p1', { ready: false }), claimed()], T0 + 100, 1],
    ['pool empty but for claimed ones: refill both at once', [claimed(), m('p3', { claimed: true, claimedAt: T0 })], T0 + 100, 2],
    ['a claimed pod of an older spec does not hold the refill', [m('p1'), claimed({ specHash: 'h0' })], T0 + 100, 1],
    ['a claimed pod of another type does not hold the refill', [m('p1'), claimed({ jobType: 'b' })], T0 + 100, 1],
  ] as const)('%s', (_n, members, now, count) => {
    const plan = planPool(want, members, now, delay);
    expect(plan.create).toEqual(count > 0 ? [{ jobType: 'a', count }] : []);
  });
  it('without refillDelayMs the refill is at once', () => {
    expect(planPool(want, [m('p1'), claimed()], T0 + 100, opts).create).toEqual([{ jobType: 'a', count: 1 }]);
  });
});

describe('planPool: back-off after failures', () => {
  const wants = [{ jobType: 'a', size: 2, specHash: 'h1' }, { jobType: 'b', size: 1, specHash: 'h1' }];
  it.each([
    ['held type creates nothing until the hold ends; others fill', T0 + 1, [{ jobType: 'b', count: 1 }]],
    ['at the end of the hold it fills again', T0 + 2000, [{ jobType: 'a', count: 2 }, { jobType: 'b', count: 1 }]],
  ])('%s', (_n, now, create) => {
    expect(planPool(wants, [], now, { ...opts, holdUntil: new Map([['a', T0 + 2000]]) }).create).toEqual(create);
  });
  it('failed members are still removed while held', () => {
    const plan = planPool(wants, [m('p1', { failed: true, ready: false })], T0 + 1, { ...opts, holdUntil: new Map([['a', T0 + 2000]]) });
    expect(plan.remove).toEqual([{ name: 'p1', reason: 'failed' }]);
  });
  it.each([
    [0, 0],
    [1, 2000],
    [2, 4000],
    [5, 32_000],
    [9, 300_000],
    [40, 300_000],
  ])('poolBackoffMs(%i) = %i', (count, ms) => {
    expect(poolBackoffMs(count)).toBe(ms);
  });
});

describe('memberOf', () => {
  const job = { metadata: { name: 'sp-w-1', labels: { 'sandpod.io/warm-pool': 'a', 'sandpod.io/pool-spec': 'h1' }, creationTimestamp: new Date(T0) }, status: {} } as never;
  const pod = (main: object, collector: object = { running: {} }, init: object[] = []) =>
    ({ metadata: { name: 'p' }, status: { phase: 'Pending', initContainerStatuses: init, containerStatuses: [{ name: 'main', state: main }, { name: 'collector', state: collector }] } }) as never;
  it.each([
    ['main and collector running: ready', pod({ running: {} }), { ready: true, failed: false }],
    ['main running, its startup probe not passed yet (the runner has no ready file): starting', { metadata: { name: 'p' }, status: { phase: 'Running', containerStatuses: [{ name: 'main', ready: false, started: false, state: { running: {} } }, { name: 'collector', ready: true, state: { running: {} } }] } } as never, { ready: false, failed: false }],
    // Kubernetes 1.20 sets `started` when the probe passes and `ready` only at the pod's next sync (up to a minute later).
    ['main started (its probe passed) but not yet `ready` in the status: ready', { metadata: { name: 'p' }, status: { phase: 'Running', containerStatuses: [{ name: 'main', ready: false, started: true, state: { running: {} } }, { name: 'collector', ready: true, started: true, state: { running: {} } }] } } as never, { ready: true, failed: false }],
    ['a status without `started` (an old kubelet): its `ready` decides', { metadata: { name: 'p' }, status: { phase: 'Running', containerStatuses: [{ name: 'main', ready: false, state: { running: {} } }, { name: 'collector', ready: true, state: { running: {} } }] } } as never, { ready: false, failed: false }],
    ['still creating: starting, not failed', pod({ waiting: { reason: 'ContainerCreating' } }, { waiting: { reason: 'ContainerCreating' } }), { ready: false, failed: false }],
    ['ImagePullBackOff on main: failed at once, with why', pod({ waiting: { reason: 'ImagePullBackOff', message: 'Back-off pulling image "x"' } }), { ready: false, failed: true, failedWhy: 'main: ImagePullBackOff: Back-off pulling image "x"' }],
    ['ErrImagePull on the collector only: failed', pod({ running: {} }, { waiting: { reason: 'ErrImagePull' } }), { ready: false, failed: true, failedWhy: 'collector: ErrImagePull:' }],
    ['CreateContainerConfigError: failed', pod({ waiting: { reason: 'CreateContainerConfigError', message: 'secret "s" not found' } }), { failed: true, failedWhy: 'main: CreateContainerConfigError: secret "s" not found' }],
    ['an init container that cannot start (StartError): failed', pod({ waiting: { reason: 'PodInitializing' } }, { waiting: {} }, [{ name: 'deps', state: { terminated: { reason: 'StartError', exitCode: 128 } } }]), { failed: true, failedWhy: 'deps: StartError:' }],
    ['main ended unclaimed: failed, with its exit', pod({ terminated: { exitCode: 123, reason: 'Error' } }), { failed: true, failedWhy: 'main ended (exit 123, Error)' }],
  ])('%s', (_n, p, want) => {
    expect(memberOf(job, p)).toMatchObject(want);
  });
  it("a claimed Job: claimed, with the claim's time from its annotation (none when unreadable)", () => {
    const claimedJob = (at: string) => ({ metadata: { name: 'sp-w-1', labels: { 'sandpod.io/warm-pool': 'a', 'sandpod.io/execution-id': 'e-1' }, annotations: { [CLAIMED_AT]: at }, creationTimestamp: new Date(T0) }, status: {} }) as never;
    expect(memberOf(claimedJob(String(T0 + 5)), pod({ running: {} }))).toMatchObject({ claimed: true, claimedAt: T0 + 5 });
    expect(memberOf(claimedJob('soon'), pod({ running: {} }))).not.toHaveProperty('claimedAt');
    expect(memberOf(job, pod({ running: {} }))).not.toHaveProperty('claimedAt');
  });
  it('a Job that is not a pool Job is no member', () => {
    expect(memberOf({ metadata: { name: 'x', labels: {} } } as never, undefined)).toBeNull();
  });
});

const IMAGE_REF = 'registry.example.com/sandpod/builds/data@sha256:' + 'b'.repeat(64);
/** A job type built on the cluster (its requirements are in the image `IMAGE_REF`). */
function builtType(over: Record<string, unknown> = {}, imageRef = IMAGE_REF): JobType {
  const jt = jobType({ requirements: ['numpy', 'pandas'], ...over });
  return { ...jt, build: { id: 'b1', digest: 'c'.repeat(64), imageRef, pythonVersion: '3.11', lock: [], version: 'latest', builtAt: new Date(0) } };
}

describe('poolable', () => {
  it.each([
    ['plain type', jobType(), [], true],
    ['run with requirements', jobType(), ['six'], false],
    ['unbuilt type with requirements (they are installed per run)', jobType({ requirements: ['numpy'] }), ['numpy'], false],
    ['built type: its requirements are in its image', builtType(), ['numpy', 'pandas'], true],
    ['built type, a run adding a requirement', builtType(), ['numpy', 'pandas', 'six'], false],
    ['a local build ref is no image: as unbuilt', builtType({}, 'local:/x'), ['numpy', 'pandas'], false],
    ['bridge without a host list', jobType({ network: { mode: 'bridge', allowed_hosts: [] } }), [], true],
    ['bridge filtered to hosts (the credential comes on the go line at the claim)', jobType({ network: { mode: 'bridge', allowed_hosts: ['pypi.org'] } }), [], true],
  ])('%s', (_n, jt, reqs, want) => {
    expect(poolable(jt, reqs as string[])).toBe(want);
  });
});

describe('claimOrder', () => {
  it('ready, unclaimed, current, not too old; oldest first', () => {
    const members = [
      m('young', { createdAt: T0 + 10 }),
      m('old'),
      m('starting', { ready: false }),
      m('taken', { claimed: true }),
      m('stale', { specHash: 'h0' }),
      m('other', { jobType: 'b' }),
      m('expired', { createdAt: T0 - 60_000 }),
      m('dying', { deleting: true }),
    ];
    expect(claimOrder(members, 'a', 'h1', T0 + 20, 60_000)).toEqual(['old', 'young']);
  });
});

describe('pool Job and claim', () => {
  const cfg = testConfig();
  it('a pool pod: main runs the runner from the sources ConfigMap (--wait --go-port, --tee), the collector runs deliver.py from it with stdin; no Secret, no per-run options', () => {
    const { job, specHash } = poolJob(jobType(), cfg, { runtimeClassName: 'gvisor', sources: 'cm-RUNNER', name: 'sp-w-1', maxIdleSec: 900 });
    const spec = job.spec!.template.spec!;
    const main = spec.containers.find((c) => c.name === 'main')!;
    const collector = spec.containers.find((c) => c.name === 'collector')!;
    // Nothing reaches main but the go line over loopback: its stdout is the program's (kubectl logs).
    expect(main.stdin).toBeUndefined();
    expect(main.command).toContain('--wait');
    expect(main.command!.slice(main.command!.indexOf('--go-port'), main.command!.indexOf('--go-port') + 2)).toEqual(['--go-port', String(GO_PORT)]);
    expect(main.command).not.toContain('--phase-fd');
    // Both scripts from the ConfigMap, mounted read-only in both containers; nothing inline.
    expect(main.command).toContain('/sandpod/runner.py');
    expect(main.command).not.toContain('-c');
    expect(spec.volumes!.find((v) => v.name === 'runner')).toEqual({ name: 'runner', configMap: { name: 'cm-RUNNER', defaultMode: 0o444 } });
    for (const c of [main, collector]) expect(c.volumeMounts!.find((v) => v.name === 'runner')).toEqual({ name: 'runner', mountPath: '/sandpod', readOnly: true });
    expect(main.command).toContain('--tee');
    expect(main.command).not.toContain('--timeout');
    expect(collector.stdin).toBe(true);
    expect(collector.stdinOnce).toBe(true);
    expect(collector.command!.slice(collector.command!.indexOf('-S'), collector.command!.indexOf('-S') + 2)).toEqual(['-S', '/sandpod/deliver.py']);
    expect(collector.command).toContain(String(GO_PORT));
    expect(spec.volumes!.some((v) => v.secret)).toBe(false);
    expect(spec.volumes!.find((v) => v.name === 'code')!.emptyDir).toBeDefined();
    // The program's code and input are read-only to main, writable only to the collector.
    expect(main.volumeMounts!.find((v) => v.name === 'code')!.readOnly).toBe(true);
    expect(main.volumeMounts!.find((v) => v.name === 'input')!.readOnly).toBe(true);
    expect(collector.volumeMounts!.find((v) => v.name === 'code')!.readOnly).toBeUndefined();
    expect(collector.volumeMounts!.find((v) => v.name === 'output')!.readOnly).toBe(true);
    expect(job.metadata!.labels!['sandpod.io/execution-id']).toBeUndefined();
    expect(job.spec!.template.metadata!.labels!['sandpod.io/pool-spec']).toBe(specHash);
    // Same inputs, same hash; a JobType change, another hash; the name does not count.
    expect(poolJob(jobType(), cfg, { runtimeClassName: 'gvisor', sources: 'cm-RUNNER', name: 'sp-w-2', maxIdleSec: 900 }).specHash).toBe(specHash);
    expect(poolJob(jobType({ memory_limit: '1g' }), cfg, { runtimeClassName: 'gvisor', sources: 'cm-RUNNER', name: 'sp-w-1', maxIdleSec: 900 }).specHash).not.toBe(specHash);
    expect(poolJob(jobType(), cfg, { runtimeClassName: 'gvisor', sources: 'cm-RUNNER2', name: 'sp-w-1', maxIdleSec: 900 }).specHash).not.toBe(specHash);
  });

  it.each([
    { name: 'plain type: the executor image, no egress label', t: jobType(), image: 'sandpod/executor:test', egress: undefined, proxyEnv: false },
    { name: 'built type: its built image by digest, its site directory on the path', t: builtType(), image: IMAGE_REF, egress: undefined, proxyEnv: false },
    { name: 'allowed_hosts type: the egress label (its NetworkPolicy), no credential in the spec', t: jobType({ network: { mode: 'bridge', allowed_hosts: ['example.com'] } }), image: 'sandpod/executor:test', egress: 'proxy', proxyEnv: false },
    { name: 'a type that preloads: the runner imports its modules while it waits', t: jobType({ preload: ['numpy', 'pandas'] }), image: 'sandpod/executor:test', egress: undefined, proxyEnv: false, preload: 'numpy,pandas' },
  ])('pool pods of every kind: $name', ({ t, image, egress, proxyEnv, preload }) => {
    const c = testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', preflight: false, egress_proxy: { url: 'http://egress.sandpod.svc:3128', key_file: '/k' } } });
    const { job } = poolJob(t, c, { runtimeClassName: 'gvisor', sources: 'cm-RUNNER', name: 'sp-w-1', maxIdleSec: 900 });
    const main = job.spec!.template.spec!.containers.find((x) => x.name === 'main')!;
    expect(main.image).toBe(image);
    expect(job.spec!.template.metadata!.labels!['sandpod.io/egress']).toBe(egress);
    expect(main.command!.some((a) => /PROXY=/i.test(a))).toBe(proxyEnv);
    if (t.build) expect(main.command!.slice(main.command!.indexOf('--python-path'), main.command!.indexOf('--python-path') + 2)).toEqual(['--python-path', BUILT_SITE_DIR]);
    // Ready only once the runner says so: its go port held, its preloads imported.
    // It says so on the pod's IP (the kubelet expands the downward API variable), which a tcpSocket
    // startup probe connects to: no exec into the sandbox.
    expect(main.command!.slice(main.command!.indexOf('--ready-listen'), main.command!.indexOf('--ready-listen') + 2)).toEqual(['--ready-listen', `$(${POD_IP_ENV}):${READY_PORT}`]);
    expect(main.env).toContainEqual({ name: POD_IP_ENV, valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } });
    expect(main.startupProbe).toEqual({ tcpSocket: { port: READY_PORT }, periodSeconds: 1, timeoutSeconds: 5, failureThreshold: 600 });
    expect(main.startupProbe?.exec).toBeUndefined();
    expect(READY_PORT).not.toBe(GO_PORT);
    const at = main.command!.indexOf('--preload');
    expect(at < 0 ? undefined : main.command![at + 1]).toBe(preload);
  });

  it('cold, warm and cold-attach pods give main the same mounts (one builder): code and input read-only', () => {
    const run = { executionId: 'e-1', code: 'x', inputJson: '{}', jobType: jobType(), timeoutSec: 10, startupTimeoutSec: 60, requirements: [], maxStdoutBytes: 100, maxArtifactBytes: 100 };
    const mainOf = (j: V1Job) => j.spec!.template.spec!.containers.find((c) => c.name === 'main')!;
    const cold = mainOf(buildJob(run, run.jobType, cfg, { runtimeClassName: 'gvisor', sources: 'sandpod-runner-test' }).job).volumeMounts!;
    const warm = mainOf(poolJob(run.jobType, cfg, { runtimeClassName: 'gvisor', sources: 'cm-R', name: 'sp-w-1', maxIdleSec: 900 }).job).volumeMounts;
    const attach = mainOf(coldAttachJob(run, cfg, { runtimeClassName: 'gvisor', sources: 'cm-R', name: 'sp-e-1', graceSec: 5 })).volumeMounts;
    // The same mounts, /sandpod included (the runner: from the run's Secret, or the sources ConfigMap).
    expect(warm).toEqual(cold);
    expect(attach).toEqual(cold);
    const attachJob = coldAttachJob(run, cfg, { runtimeClassName: 'gvisor', sources: 'cm-R', name: 'sp-e-1', graceSec: 5 });
    expect(attachJob.spec!.template.spec!.volumes!.find((v) => v.name === 'runner')).toEqual({ name: 'runner', configMap: { name: 'cm-R', defaultMode: 0o444 } });
    expect(JSON.stringify(attachJob).length).toBeLessThan(10_000);
    expect(cold.filter((m) => m.readOnly).map((m) => m.mountPath)).toEqual(expect.arrayContaining(['/code', '/input']));
    // A cold attach pod's program comes as soon as its collector runs: no startup probe to pass.
    const attachMain = mainOf(coldAttachJob(run, cfg, { runtimeClassName: 'gvisor', sources: 'cm-R', name: 'sp-e-1', graceSec: 5 }));
    expect(attachMain.startupProbe).toBeUndefined();
    // ... and no ready port: its runner goes straight to the go port.
    expect(attachMain.command).not.toContain('--ready-listen');
    expect(attachMain.command!.slice(-2)).toEqual(['--go-port', String(GO_PORT)]);
    expect((attachMain.env ?? []).map((e) => e.name)).not.toContain(POD_IP_ENV);
    // Its collector may have the program before main's runner listens: it waits for the runner up to
    // the run's startup limit (deliver.py's own default, 60 s, failed cold starts on a loaded node).
    const collectorOf = (j: ReturnType<typeof coldAttachJob>) => j.spec!.template.spec!.containers.find((c) => c.name === 'collector')!;
    const slow = collectorOf(coldAttachJob({ ...run, startupTimeoutSec: 300 }, cfg, { runtimeClassName: 'gvisor', sources: 'cm-R', name: 'sp-e-1', graceSec: 5 })).command!;
    expect(slow.slice(-2)).toEqual(['--connect-timeout', '300']);
    // A pool pod's collector keeps the default: its runner listened before the pod counted ready.
    expect(collectorOf(poolJob(jobType(), cfg, { runtimeClassName: 'gvisor', sources: 'cm-R', name: 'sp-w-1', maxIdleSec: 900 }).job).command).not.toContain('--connect-timeout');
  });

  it('a claim is a small JSON patch: the read resourceVersion as precondition, the run\'s labels and annotations, the claim time, a deadline counted from now', () => {
    const { job } = poolJob(jobType(), cfg, { runtimeClassName: null, sources: 'cm-R', name: 'sp-w-1', maxIdleSec: 900 });
    const read = { ...job, metadata: { ...job.metadata, resourceVersion: '42' }, status: { startTime: new Date(T0) } };
    const ops = claimJobPatch(read, { executionId: 'e-1', timeoutSec: 10, startupTimeoutSec: 60 }, 5, T0 + 100_000);
    expect(ops).toEqual([
      { op: 'replace', path: '/metadata/resourceVersion', value: '42' },
      { op: 'add', path: '/metadata/labels/sandpod.io~1execution-id', value: 'e-1' },
      { op: 'add', path: '/metadata/annotations/sandpod.io~1execution-id', value: 'e-1' },
      { op: 'add', path: '/metadata/annotations/sandpod.io~1timeout-seconds', value: '10' },
      { op: 'add', path: '/metadata/annotations/sandpod.io~1startup-timeout-seconds', value: '60' },
      { op: 'add', path: '/metadata/annotations/sandpod.io~1claimed-at', value: String(T0 + 100_000) },
      { op: 'replace', path: '/spec/activeDeadlineSeconds', value: 100 + 10 + 5 },
    ]);
    // Nothing of the pod template (the runner's text) is sent.
    expect(JSON.stringify(ops).length).toBeLessThan(600);
  });
});

describe('afterHandOverFailure', () => {
  it.each([
    ['warm, first failure: another pool pod', 'warm', 1, 'warm'],
    ['warm, second failure: cold', 'warm', 2, 'cold'],
    ['warm, later failures: cold', 'warm', 5, 'cold'],
    ['cold attach: the attempt fails (the service retries it)', 'cold-attach', 1, 'fail'],
  ] as const)('%s', (_n, path, failures, next) => {
    expect(afterHandOverFailure(path, failures)).toBe(next);
  });
  it('no warm retries allowed: cold at once', () => {
    expect(afterHandOverFailure('warm', 1, 0)).toBe('cold');
  });
});

describe('decide on a warm run', () => {
  const pod = { metadata: { name: 'p' }, status: { phase: 'Running', containerStatuses: [
    { name: 'main', state: { running: { startedAt: new Date(T0 - 600_000) } } },
    { name: 'collector', state: { running: { startedAt: new Date(T0 - 600_000) } } },
  ] } } as never;
  const state = (warm: { deliveredAt: number | null; done: { exitCode: number; at: number } | null }) =>
    newRunState({ executionId: 'e', jobName: 'sp-w-1', startedAt: T0, startupTimeoutMs: 5000, podGoneGraceMs: 100, jobSeen: true, warm });
  it.each([
    ['before delivery: main running means nothing, the startup deadline waits', { deliveredAt: null, done: null }, [{ type: 'wakeAt', at: T0 + 5000 }]],
    ['delivered: execution starts at delivery', { deliveredAt: T0 + 20, done: null }, [{ type: 'enterExecution', mainStartedAt: T0 + 20 }]],
    ['done: collect at once, main still running', { deliveredAt: T0 + 20, done: { exitCode: 0, at: T0 + 50 } }, [{ type: 'enterExecution', mainStartedAt: T0 + 20 }, { type: 'collect', pod: 'p' }]],
    ['done 137 waits for the container (OOM or not)', { deliveredAt: T0 + 20, done: { exitCode: 137, at: T0 + 50 } }, [{ type: 'enterExecution', mainStartedAt: T0 + 20 }]],
  ])('%s', (_n, warm, actions) => {
    expect(decide(state(warm), { metadata: { name: "sp-w-1" }, status: {} }, pod, T0 + 60)).toEqual(actions);
  });

  it('observation: startup is until delivery, execution from delivery to done, exit code from done', () => {
    const s = state({ deliveredAt: T0 + 20, done: { exitCode: 3, at: T0 + 70 } });
    s.collection = { ok: true, output: {} as never };
    s.released = true;
    const [finish] = decide(s, { metadata: { name: "sp-w-1" }, status: {} }, pod, T0 + 90);
    expect(finish).toMatchObject({ type: 'finish', observation: { exitCode: 3, phase: 'failed', startupMs: 20, executionMs: 50, totalMs: 70 } });
  });
});
