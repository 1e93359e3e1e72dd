/**
 * The pure parts of Kubernetes job-type builds: the build Job (snapshot + Kubernetes schemas), the
 * build pod's verdicts, the environment digest, image references and registry credentials, the
 * reproducible layer and the refusal of hostile build trees.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import * as tar from 'tar-stream';
import { afterAll, describe, expect, it } from 'vitest';
import * as v from 'valibot';
import { JobTypeConfigSchema, parseConfig } from '../../../../src/config.ts';
import { fromConfig, type JobType } from '../../../../src/jobtypes/job-type.ts';
import { BUILD_LABEL, buildEnvJob, buildJobName } from '../../../../src/runtime/kubernetes/builds/build-env-job.ts';
import { composeConfig, composeManifest, ENV_SITE } from '../../../../src/runtime/kubernetes/builds/build-image.ts';
import { buildJob, BUILT_SITE_DIR } from '../../../../src/runtime/kubernetes/runs/build-job.ts';
import { collectTree, TreeError, writeLayer, type TreeEntry } from '../../../../src/runtime/kubernetes/builds/build-layer.ts';
import { credentialsFromDockerConfig, MEDIA, parseChallenge, parseImageReference } from '../../../../src/runtime/kubernetes/builds/build-registry.ts';
import { buildPodVerdict, kubernetesEnvironmentDigest } from '../../../../src/runtime/kubernetes/builds/builder.ts';
import type { RunSpec } from '../../../../src/runtime/runtime.ts';
import { JOB_SPEC_FIELDS_1_20, validateJob } from '../../../support/k8s-schema.ts';

const config = parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'registry.example.com/sandpod/executor@sha256:' + 'a'.repeat(64), build_registry: 'registry.example.com/sandpod/builds' } }, {});
const work = mkdtempSync(path.join(tmpdir(), 'build-unit-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe('buildEnvJob', () => {
  const input = { jobType: 'data', buildKey: '2a1c9a4e-0000-4000-8000-000000000001', image: 'registry.example.com/sandpod/executor@sha256:' + 'a'.repeat(64), requirements: ['numpy==1.26.4', 'pandas'], runtimeClassName: 'gvisor', deadlineSeconds: 1799.2 };

  it.each([
    { name: 'strict', c: config, i: input },
    { name: 'permissive-find-links-no-seccomp', c: parseConfig({ runtime: 'kubernetes', enable_seccomp: false, pip: { find_links: ['http://10.244.0.1:8080/'], no_index: true }, kubernetes: { build_registry: 'r.local:5000', instance: 'blue' } }, {}), i: { ...input, runtimeClassName: null } },
  ])('$name: matches its snapshot and the Kubernetes schemas; restricted and unprivileged', async ({ name, c, i }) => {
    const job = buildEnvJob(i, c);
    validateJob(job);
    for (const k of Object.keys(job.spec!)) expect(JOB_SPEC_FIELDS_1_20.has(k)).toBe(true);
    const pod = job.spec!.template.spec!;
    expect(pod.automountServiceAccountToken).toBe(false);
    for (const ctr of [...pod.initContainers!, ...pod.containers]) {
      expect(ctr.securityContext).toMatchObject({ runAsNonRoot: true, allowPrivilegeEscalation: false, privileged: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
      expect(ctr.image).toBe(i.image);
    }
    const pip = pod.initContainers![0]!.command!;
    // Requirements after `--`: never options; the lock comes from --report; no byte code.
    expect(pip.slice(pip.indexOf('--') + 1)).toEqual(i.requirements);
    expect(pip).toEqual(expect.arrayContaining(['--report', '/build/report.json', '--target', '/build/site', '--no-compile']));
    expect(job.metadata!.labels![BUILD_LABEL]).toBe('data');
    expect(job.spec!.activeDeadlineSeconds).toBe(1800);
    await expect(JSON.stringify(job, null, 2) + '\n').toMatchFileSnapshot(`./__snapshots__/build-env-job.${name}.json`);
  });

  it('names are DNS labels of at most 52 characters and differ per build', () => {
    const long = buildJobName('a'.repeat(63), 'k1');
    expect(long.length).toBeLessThanOrEqual(52);
    expect(long).toMatch(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/);
    expect(buildJobName('data', 'k1')).not.toBe(buildJobName('data', 'k2'));
  });
});

describe('runs of a built type', () => {
  const jt = (o: Partial<JobType> = {}): JobType => ({ ...fromConfig(v.parse(JobTypeConfigSchema, { name: 'data', requirements: ['tinypkg'] })), ...o });
  const imageRef = 'registry.example.com/sandpod/builds/data@sha256:' + 'b'.repeat(64);
  const built = jt({ build: { id: 'b1', digest: 'c'.repeat(64), imageRef, pythonVersion: '3.11', lock: [], version: 'latest', builtAt: new Date(0) } });
  const spec = (t: JobType, requirements: string[]): RunSpec => ({ executionId: 'e1', code: '', inputJson: '{}', jobType: t, timeoutSec: 5, startupTimeoutSec: 5, requirements, maxStdoutBytes: 10, maxArtifactBytes: 10 });
  const opts = { runtimeClassName: null, sources: 'sandpod-runner-test' };

  it.each([
    { name: 'unbuilt: executor image, deps init container', t: jt(), reqs: ['tinypkg'], image: 'registry.example.com/sandpod/executor@sha256:' + 'a'.repeat(64), deps: ['tinypkg'], paths: ['/deps'] },
    { name: 'built: its image by digest, nothing installed', t: built, reqs: ['tinypkg'], image: imageRef, deps: null, paths: [BUILT_SITE_DIR] },
    { name: 'built + a request requirement: only that one installed', t: built, reqs: ['tinypkg', 'extra'], image: imageRef, deps: ['extra'], paths: ['/deps', BUILT_SITE_DIR] },
    { name: 'local build ref is no image: as unbuilt', t: jt({ build: { ...built.build!, imageRef: 'local:/x' } }), reqs: ['tinypkg'], image: 'registry.example.com/sandpod/executor@sha256:' + 'a'.repeat(64), deps: ['tinypkg'], paths: ['/deps'] },
  ])('$name', ({ t, reqs, image, deps, paths }) => {
    const { job } = buildJob(spec(t, reqs), t, config, opts);
    const pod = job.spec!.template.spec!;
    expect(pod.containers[0]!.image).toBe(image);
    const init = pod.initContainers?.find((c) => c.name === 'deps');
    if (deps === null) expect(init).toBeUndefined();
    else expect(init!.command!.slice(init!.command!.indexOf('deps') + 1)).toEqual(deps);
    const cmd = pod.containers[0]!.command!;
    expect(cmd.flatMap((a, i) => (a === '--python-path' ? [cmd[i + 1]] : []))).toEqual(paths);
  });

  it('the image layer and the runner agree on the site directory', () => {
    expect(BUILT_SITE_DIR).toBe(ENV_SITE);
  });
});

describe('buildPodVerdict', () => {
  const pod = (status: V1Pod['status'], meta: V1Pod['metadata'] = {}): V1Pod => ({ metadata: { name: 'spb-x', ...meta }, status });
  const term = (exitCode: number, message?: string) => ({ terminated: { exitCode, ...(message ? { message } : {}) } });
  const ctr = (name: string, state: object) => ({ name, image: 'i', imageID: '', ready: false, restartCount: 0, state });
  const failedJob: V1Job = { status: { conditions: [{ type: 'Failed', status: 'True', reason: 'DeadlineExceeded', message: 'too long' }] } };

  it.each([
    { name: 'no pod yet', job: undefined, p: undefined, kind: 'wait' },
    { name: 'pip running', job: undefined, p: pod({ initContainerStatuses: [ctr('pip', { running: {} })], containerStatuses: [ctr('hold', { waiting: { reason: 'PodInitializing' } })] }), kind: 'wait' },
    { name: 'pip done, hold running', job: undefined, p: pod({ initContainerStatuses: [ctr('pip', term(0))], containerStatuses: [ctr('hold', { running: {} })] }), kind: 'collect' },
    { name: 'pip failed', job: undefined, p: pod({ phase: 'Failed', initContainerStatuses: [ctr('pip', term(1, 'No matching distribution'))] }), kind: 'failed', msg: /pip install failed \(exit 1\)/ },
    { name: 'image cannot be pulled', job: undefined, p: pod({ initContainerStatuses: [ctr('pip', { waiting: { reason: 'ErrImagePull', message: 'not found' } })] }), kind: 'failed', msg: /ErrImagePull: not found/ },
    { name: 'Job deadline', job: failedJob, p: undefined, kind: 'failed', msg: /DeadlineExceeded too long/ },
    { name: 'hold ended before collection', job: undefined, p: pod({ initContainerStatuses: [ctr('pip', term(0))], containerStatuses: [ctr('hold', term(0))] }), kind: 'failed', msg: /before its files were collected/ },
    { name: 'deleted', job: undefined, p: pod({ initContainerStatuses: [ctr('pip', { running: {} })] }, { deletionTimestamp: new Date() }), kind: 'failed', msg: /deleted/ },
    { name: 'unschedulable: waits, says why', job: undefined, p: pod({ conditions: [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message: '0/1 nodes' }] }), kind: 'wait', detail: /0\/1 nodes/ },
  ])('$name → $kind', ({ job, p, kind, msg, detail }) => {
    const verdict = buildPodVerdict(job, p);
    expect(verdict.kind).toBe(kind);
    if (msg) expect(verdict.kind === 'failed' && verdict.message).toMatch(msg);
    if (detail) expect(verdict.kind === 'wait' && verdict.detail).toMatch(detail);
  });
});

describe('kubernetesEnvironmentDigest', () => {
  const base = { pythonVersion: '3.11', baseDigest: 'sha256:' + 'a'.repeat(64), platform: 'linux/amd64', runnerSha256: 'r', lock: [{ name: 'tinypkg', version: '1.0.0', sha256: 'f'.repeat(64) }] };
  it.each([
    ['python version', { pythonVersion: '3.12' }],
    ['base image', { baseDigest: 'sha256:' + 'b'.repeat(64) }],
    ['platform', { platform: 'linux/arm64' }],
    ['runner', { runnerSha256: 's' }],
    ['a locked version', { lock: [{ name: 'tinypkg', version: '1.0.1', sha256: 'f'.repeat(64) }] }],
    ['a locked hash', { lock: [{ name: 'tinypkg', version: '1.0.0', sha256: 'e'.repeat(64) }] }],
  ])('changes with the %s, and only then', (_what, change) => {
    expect(kubernetesEnvironmentDigest({ ...base })).toBe(kubernetesEnvironmentDigest({ ...base, lock: [...base.lock] }));
    expect(kubernetesEnvironmentDigest({ ...base, ...change })).not.toBe(kubernetesEnvironmentDigest(base));
  });
});

describe('image references and credentials', () => {
  it.each([
    ['127.0.0.1:5000/sandpod/executor:dev', { registry: '127.0.0.1:5000', repository: 'sandpod/executor', tag: 'dev', digest: null }],
    ['python:3.11-slim', { registry: 'docker.io', repository: 'library/python', tag: '3.11-slim', digest: null }],
    ['ghcr.io/sandpod/executor', { registry: 'ghcr.io', repository: 'sandpod/executor', tag: 'latest', digest: null }],
    [`localhost/x@sha256:${'a'.repeat(64)}`, { registry: 'localhost', repository: 'x', tag: null, digest: `sha256:${'a'.repeat(64)}` }],
    [`r.io:443/a/b:1@sha256:${'a'.repeat(64)}`, { registry: 'r.io:443', repository: 'a/b', tag: '1', digest: `sha256:${'a'.repeat(64)}` }],
  ])('%s', (ref, want) => {
    expect(parseImageReference(ref)).toEqual(want);
  });

  it.each(['r.io/UPPER:1', 'r.io/a@sha256:short', 'r.io/a:bad tag'])('refuses %s', (ref) => {
    expect(() => parseImageReference(ref)).toThrow();
  });

  it('reads dockerconfigjson: auth or username/password, keyed by host or URL', () => {
    const doc = JSON.stringify({
      auths: {
        'https://registry.example.com/v1/': { auth: Buffer.from('bob:pa:ss').toString('base64') },
        'other.io': { username: 'al', password: 'x' },
        'https://index.docker.io/v1/': { auth: Buffer.from('hub:tok').toString('base64') },
      },
    });
    expect(credentialsFromDockerConfig(doc, 'registry.example.com')).toEqual({ username: 'bob', password: 'pa:ss' });
    expect(credentialsFromDockerConfig(doc, 'other.io')).toEqual({ username: 'al', password: 'x' });
    expect(credentialsFromDockerConfig(doc, 'docker.io')).toEqual({ username: 'hub', password: 'tok' });
    expect(credentialsFromDockerConfig(doc, 'nowhere.io')).toBeNull();
    expect(() => credentialsFromDockerConfig('{', 'x')).toThrow(/not JSON/);
  });

  it('parses Bearer and Basic challenges', () => {
    expect(parseChallenge('Bearer realm="https://auth.io/token",service="registry.io",scope="repository:a/b:pull,push"')).toEqual({
      scheme: 'bearer',
      params: { realm: 'https://auth.io/token', service: 'registry.io', scope: 'repository:a/b:pull,push' },
    });
    expect(parseChallenge('Basic realm="test"')).toEqual({ scheme: 'basic', params: { realm: 'test' } });
  });
});

describe('image composition', () => {
  const base = { schemaVersion: 2 as const, config: { mediaType: MEDIA.ociConfig, digest: 'sha256:c', size: 1 }, layers: [{ mediaType: MEDIA.ociLayerGzip, digest: 'sha256:l1', size: 5 }] };
  it.each([
    [MEDIA.dockerManifest, MEDIA.dockerManifest, MEDIA.dockerConfig, MEDIA.dockerLayerGzip],
    [MEDIA.ociManifest, MEDIA.ociManifest, MEDIA.ociConfig, MEDIA.ociLayerGzip],
  ])('base %s → manifest %s with matching config and layer types', (baseType, mt, cfgType, layerType) => {
    const m = composeManifest(baseType, base, { digest: 'sha256:n', size: 9 }, { digest: 'sha256:l2', size: 7 });
    const doc = JSON.parse(m.body.toString());
    expect(m.mediaType).toBe(mt);
    expect(doc.config).toEqual({ mediaType: cfgType, digest: 'sha256:n', size: 9 });
    expect(doc.layers.map((l: { digest: string }) => l.digest)).toEqual(['sha256:l1', 'sha256:l2']);
    expect(doc.layers[1].mediaType).toBe(layerType);
  });

  it('config: PYTHONPATH first on the site directory, diff id appended, labels, the rest kept', () => {
    const cfg = JSON.parse(composeConfig({ os: 'linux', config: { Env: ['A=1'], User: '1000' }, rootfs: { type: 'layers', diff_ids: ['sha256:d1'] } }, { diffId: 'sha256:d2' }, { jobType: 'data', envDigest: 'e' }).toString());
    expect(cfg.config.Env).toEqual(['A=1', `PYTHONPATH=${ENV_SITE}`]);
    expect(cfg.config.User).toBe('1000');
    expect(cfg.rootfs.diff_ids).toEqual(['sha256:d1', 'sha256:d2']);
    expect(cfg.config.Labels).toEqual({ 'io.sandpod.job-type': 'data', 'io.sandpod.environment': 'sha256:e' });
    expect(cfg.os).toBe('linux');
  });
});

/** A tar stream of the given entries, as the build pod's `tar` would send it. */
function tarOf(entries: { name: string; type?: 'file' | 'directory' | 'symlink' | 'link' | 'fifo'; body?: string; linkname?: string; mode?: number; mtime?: Date }[]): Readable {
  const pack = tar.pack();
  for (const e of entries) pack.entry({ name: e.name, type: e.type ?? 'file', mode: e.mode ?? 0o644, mtime: e.mtime ?? new Date(), ...(e.linkname ? { linkname: e.linkname } : {}) }, e.body ?? '');
  pack.finalize();
  return pack as unknown as Readable;
}

describe('build trees and layers', () => {
  it('the same tree gives the same layer bytes, whatever the archive order, times and modes', async () => {
    const a = await collectTree(
      tarOf([
        { name: './site/', type: 'directory' },
        { name: './site/b.py', body: 'B\n', mtime: new Date(1e12) },
        { name: './site/a/x.py', body: 'X\n', mode: 0o600 },
        { name: './site/bin/tool', body: '#!\n', mode: 0o700 },
        { name: './report.json', body: '{}' },
      ]),
      path.join(work, 'a'),
    );
    const b = await collectTree(
      tarOf([
        { name: 'report.json', body: '{}' },
        { name: 'site/bin/tool', body: '#!\n', mode: 0o755 },
        { name: 'site/a/x.py', body: 'X\n', mtime: new Date(5) },
        { name: 'site/b.py', body: 'B\n', mode: 0o664 },
      ]),
      path.join(work, 'b'),
    );
    const la = await writeLayer(a.values(), 'sandpod-env', path.join(work, 'a.tgz'));
    const lb = await writeLayer(b.values(), 'sandpod-env', path.join(work, 'b.tgz'));
    expect(la.digest).toBe(lb.digest);
    expect(la.diffId).toBe(lb.diffId);
    expect(readFileSync(la.file).equals(readFileSync(lb.file))).toBe(true);

    // Its entries: sorted, parents first, root-owned, mtime 0, 0755/0644.
    const seen: { name: string; mode: number; uid: number; mtime: number }[] = [];
    const ex = tar.extract();
    ex.on('entry', (h, s, next) => {
      seen.push({ name: h.name, mode: h.mode ?? 0, uid: h.uid ?? -1, mtime: h.mtime?.getTime() ?? -1 });
      s.on('end', next);
      s.resume();
    });
    const { createGunzip } = await import('node:zlib');
    await new Promise((resolve, reject) => {
      ex.on('finish', () => resolve(undefined));
      ex.on('error', reject);
      Readable.from(readFileSync(la.file)).pipe(createGunzip()).pipe(ex);
    });
    expect(seen.map((s) => s.name)).toEqual(['sandpod-env/', 'sandpod-env/report.json', 'sandpod-env/site/', 'sandpod-env/site/a/', 'sandpod-env/site/a/x.py', 'sandpod-env/site/b.py', 'sandpod-env/site/bin/', 'sandpod-env/site/bin/tool']);
    expect(new Set(seen.map((s) => s.uid))).toEqual(new Set([0]));
    expect(new Set(seen.map((s) => s.mtime))).toEqual(new Set([0]));
    expect(seen.find((s) => s.name.endsWith('tool'))!.mode).toBe(0o755);
    expect(seen.find((s) => s.name.endsWith('x.py'))!.mode).toBe(0o644);
  });

  it('a changed file changes the layer', async () => {
    const one: TreeEntry[] = [{ type: 'file', name: 'site/a.py', size: 2, executable: false, source: { data: Buffer.from('A\n') } }];
    const two: TreeEntry[] = [{ type: 'file', name: 'site/a.py', size: 2, executable: false, source: { data: Buffer.from('B\n') } }];
    expect((await writeLayer(one, 'p', path.join(work, '1.tgz'))).digest).not.toBe((await writeLayer(two, 'p', path.join(work, '2.tgz'))).digest);
  });

  it('hard links become copies; symlinks stay links', async () => {
    const t = await collectTree(tarOf([{ name: 'site/a.py', body: 'A' }, { name: 'site/b.py', type: 'link', linkname: 'site/a.py' }, { name: 'site/c.py', type: 'symlink', linkname: 'a.py' }]), path.join(work, 'links'));
    expect(t.get('site/b.py')).toMatchObject({ type: 'file', size: 1 });
    expect(t.get('site/c.py')).toEqual({ type: 'symlink', name: 'site/c.py', target: 'a.py' });
  });

  it.each([
    ['an absolute name', [{ name: '/etc/passwd', body: 'x' }], /unsafe name/],
    ['a parent escape', [{ name: 'site/../../x', body: 'x' }], /unsafe name/],
    ['a fifo', [{ name: 'site/f', type: 'fifo' as const }], /fifo/],
    ['a hard link to nothing', [{ name: 'site/l', type: 'link' as const, linkname: 'nope' }], /hard link/],
  ])('refuses %s', async (_what, entries, msg) => {
    await expect(collectTree(tarOf(entries), path.join(work, 'bad'))).rejects.toSatisfy((e: unknown) => e instanceof TreeError && msg.test((e as Error).message));
  });

  it('refuses a tree over its caps', async () => {
    await expect(collectTree(tarOf([{ name: 'a', body: 'x'.repeat(100) }]), path.join(work, 'cap'), { maxTotalBytes: 10, maxEntries: 10 })).rejects.toThrow(/more than 10 bytes/);
    await expect(collectTree(tarOf([{ name: 'a' }, { name: 'b' }]), path.join(work, 'cap2'), { maxTotalBytes: 100, maxEntries: 1 })).rejects.toThrow(/more than 1 files/);
  });
});
