/**
 * The Kubernetes build flow against the in-repo fake API server and a real OCI registry
 * (docker-registry on loopback): the runtime's builder creates the build Job, waits for its pod,
 * streams the installed directory out of the `hold` container (the fake's exec answers with what a
 * real `pip install --target --report` of a local wheel left, packed by the real `tar`), pushes the
 * layer on top of the executor image, reports the JobType's status and deletes the Job.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createGunzip } from 'node:zlib';
import { Readable } from 'node:stream';
import * as tar from 'tar-stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { JobTypeStatus } from '../../../src/jobtypes/kubernetes-registry.ts';
import { BUILD_CONTAINERS, BUILD_LABEL } from '../../../src/runtime/kubernetes/builds/build-env-job.ts';
import { RegistryClient } from '../../../src/runtime/kubernetes/builds/build-registry.ts';
import { BuildFailedError, type Builder, type BuildRequest, type Runtime } from '../../../src/runtime/runtime.ts';
import { FakeKube, jobType, startRuntime, testConfig } from '../../support/kube-runtime.ts';
import { hasRegistry, pushBase, startRegistry, type TestRegistry } from '../../support/oci-registry.ts';
import { buildWheels } from '../../support/wheel.ts';

const NS = 'sandpod';
const RUNS = 'sandpod-jobs';

/** What a real pip leaves in /build: `site/` and `report.json`, as a tar stream. */
function pipInstallTar(wheels: string, reqs: string[]): Buffer {
  const dir = mkdtempSync(path.join(tmpdir(), 'fake-build-'));
  try {
    execFileSync('python3', ['-m', 'pip', 'install', '--quiet', '--no-index', '--find-links', wheels, '--no-compile', '--target', path.join(dir, 'site'), '--report', path.join(dir, 'report.json'), '--', ...reqs], { stdio: 'ignore' });
    return execFileSync('tar', ['-C', dir, '-cf', '-', 'site', 'report.json'], { maxBuffer: 64 * 1024 * 1024 });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function layerNames(client: RegistryClient, repo: string, digest: string): Promise<Map<string, string>> {
  const blob = await client.getBlob(repo, digest);
  const out = new Map<string, string>();
  const ex = tar.extract();
  ex.on('entry', (h, s, next) => {
    const chunks: Buffer[] = [];
    s.on('data', (c: unknown) => void chunks.push(c as Buffer));
    s.on('end', () => {
      out.set(h.name, Buffer.concat(chunks).toString('utf8'));
      next();
    });
  });
  await new Promise((resolve, reject) => {
    ex.on('finish', () => resolve(undefined));
    ex.on('error', reject);
    Readable.from(blob).pipe(createGunzip()).pipe(ex);
  });
  return out;
}

describe.skipIf(!hasRegistry)('Kubernetes builds (fake API server, real registry, real pip)', () => {
  let reg: TestRegistry;
  let fake: FakeKube;
  let rt: Runtime;
  let wheels: string;
  let work: string;
  let baseDigest: string;

  beforeAll(async () => {
    reg = await startRegistry();
    work = mkdtempSync(path.join(tmpdir(), 'k8s-build-'));
    baseDigest = (await pushBase(new RegistryClient(reg.host, { insecure: true }), work, 'sandpod/executor')).digest;
    wheels = buildWheels([{ name: 'tinypkg', version: '1.0.0', modules: { '__init__.py': 'VALUE = 42\n' } }, { name: 'tinypkg', version: '2.0.0' }]);
  });
  afterAll(async () => {
    await reg?.stop();
    rmSync(work, { recursive: true, force: true });
  });
  afterEach(async () => {
    await rt?.stop();
    await fake?.close();
  });

  const start = async (over: Record<string, unknown> = {}) => {
    fake = await FakeKube.start({ schedulePods: true });
    const config = testConfig({
      workspace: work,
      security_mode: 'permissive',
      kubernetes: { executor_image: `${reg.host}/sandpod/executor:v1`, preflight: false, build_registry: `${reg.host}/sandpod/builds`, build_registry_insecure: true, ...over },
    });
    rt = await startRuntime(fake, { config, options: { tuning: { buildPollMs: 20, execTimeoutMs: 10_000, informerBackoffInitialMs: 20, healthCacheMs: 0 } } });
    return rt.builder as Builder;
  };

  const request = (reqs: string[], phases: string[] = [], name = 'data'): BuildRequest => ({
    jobType: jobType({ name, requirements: reqs }),
    requirements: reqs,
    onProgress: (p) => phases.push(p),
    deadline: Date.now() + 30_000,
  });

  /** Plays the kubelet: pip ran (exit `pipExit`, its log), then `hold` runs. */
  const driven = new Set<string>();
  const driveBuildPod = async (pipExit: number, log = ''): Promise<string> => {
    let pod = '';
    // The pod of the build now running: not one of an earlier build that is still going away.
    await fake.waitFor(() => {
      pod = fake.list('pods', RUNS).find((p) => p.metadata.labels?.[BUILD_LABEL] && !driven.has(p.metadata.name) && !p.metadata.deletionTimestamp)?.metadata.name ?? '';
      return pod !== '';
    });
    driven.add(pod);
    if (log) fake.setLog(pod, BUILD_CONTAINERS.pip, log);
    fake.updatePod(pod, (p) => {
      p.status.initContainerStatuses = [{ name: 'pip', image: '', imageID: '', ready: false, restartCount: 0, state: { terminated: { exitCode: pipExit, reason: pipExit ? 'Error' : 'Completed' } } }];
      if (pipExit === 0) p.status.containerStatuses = [{ name: 'hold', image: '', imageID: '', ready: true, restartCount: 0, started: true, state: { running: { startedAt: new Date().toISOString() } } }];
    });
    return pod;
  };

  it('builds: Job in the runs namespace, files streamed out, layer pushed by digest, JobType status Ready, Job deleted', async () => {
    const builder = await start();
    fake.upsertJobType(NS, 'data', { requirements: ['tinypkg==1.0.0'] });
    const archive = pipInstallTar(wheels, ['tinypkg==1.0.0']);
    fake.onExec((call) => (call.container === BUILD_CONTAINERS.hold && call.command[0] === 'tar' ? { stdout: archive } : undefined));

    const phases: string[] = [];
    const building = builder.build(request(['tinypkg==1.0.0'], phases));
    await fake.waitFor(() => fake.list('jobs', RUNS).some((j) => j.metadata.labels?.[BUILD_LABEL] === 'data'));
    const job = fake.list('jobs', RUNS).find((j) => j.metadata.labels?.[BUILD_LABEL] === 'data')!;
    // The build installs into the executor image pinned by digest.
    expect(job.spec.template.spec.initContainers[0].image).toBe(`${reg.host}/sandpod/executor@${baseDigest}`);
    await fake.waitFor(() => (fake.get('jobtypes', NS, 'data')?.status as JobTypeStatus | undefined)?.conditions?.some((c) => c.type === 'Building' && c.status === 'True') ?? false);
    await driveBuildPod(0);
    const env = await building;

    expect(phases).toEqual(expect.arrayContaining(['resolving', 'installing', 'publishing']));
    expect(env.lock).toEqual([{ name: 'tinypkg', version: '1.0.0', sha256: expect.stringMatching(/^[a-f0-9]{64}$/) }]);
    expect(env.imageRef).toMatch(new RegExp(`^${reg.host.replace(/\./g, '\\.')}/sandpod/builds/data@sha256:[a-f0-9]{64}$`));

    // What the registry holds: the base's layer plus ours with the package, the lock and build.json.
    const client = new RegistryClient(reg.host, { insecure: true });
    const manifestDigest = env.imageRef.split('@')[1]!;
    const image = await client.getImage('sandpod/builds/data', manifestDigest, 'linux/amd64');
    expect(image.manifest.layers).toHaveLength(2);
    const files = await layerNames(client, 'sandpod/builds/data', image.manifest.layers[1]!.digest);
    expect(files.get('sandpod-env/site/tinypkg/__init__.py')).toBe('VALUE = 42\n');
    expect(files.get('sandpod-env/requirements.lock')).toBe(`tinypkg==1.0.0 --hash=sha256:${env.lock[0]!.sha256}\n`);
    expect(JSON.parse(files.get('sandpod-env/build.json')!)).toMatchObject({ digest: env.digest, base: `${reg.host}/sandpod/executor@${baseDigest}` });
    expect([...files.keys()].some((n) => n.includes('report.json'))).toBe(false);
    // Tagged with the environment digest too.
    expect((await client.getManifest('sandpod/builds/data', `sha256-${env.digest}`)).digest).toBe(manifestDigest);

    const status = fake.get('jobtypes', NS, 'data')!.status as JobTypeStatus;
    expect(status.imageDigest).toBe(manifestDigest);
    expect(status.conditions?.find((c) => c.type === 'Ready')).toMatchObject({ status: 'True', reason: 'BuildSucceeded' });
    expect(status.conditions?.find((c) => c.type === 'Building')).toMatchObject({ status: 'False' });
    expect(status.conditions?.find((c) => c.type === 'Failed')).toMatchObject({ status: 'False' });
    // The collector was released and the Job deleted.
    expect(fake.execs.some((e) => e.container === BUILD_CONTAINERS.hold && e.command.join(' ').includes('/control/release'))).toBe(true);
    await fake.waitFor(() => !fake.list('jobs', RUNS).some((j) => j.metadata.labels?.[BUILD_LABEL]));

    // Same inputs again: the same environment digest and the very same image (a reproducible layer).
    const again = builder.build(request(['tinypkg==1.0.0']));
    await driveBuildPod(0);
    const env2 = await again;
    expect(env2.digest).toBe(env.digest);
    expect(env2.imageRef).toBe(env.imageRef);
  });

  it('a changed requirement gives another digest and image', async () => {
    const builder = await start();
    const a = pipInstallTar(wheels, ['tinypkg==1.0.0']);
    const b = pipInstallTar(wheels, ['tinypkg==2.0.0']);
    let next = a;
    fake.onExec((call) => (call.container === BUILD_CONTAINERS.hold && call.command[0] === 'tar' ? { stdout: next } : undefined));
    const one = builder.build(request(['tinypkg==1.0.0']));
    await driveBuildPod(0);
    const envA = await one;
    await fake.waitFor(() => !fake.list('jobs', RUNS).some((j) => j.metadata.labels?.[BUILD_LABEL]));
    next = b;
    const two = builder.build(request(['tinypkg==2.0.0']));
    await driveBuildPod(0);
    const envB = await two;
    expect(envB.digest).not.toBe(envA.digest);
    expect(envB.imageRef).not.toBe(envA.imageRef);
    expect(envB.lock[0]!.version).toBe('2.0.0');
  });

  it("pip fails: BuildFailedError with pip's output; the JobType says Failed with that message", async () => {
    const builder = await start();
    fake.upsertJobType(NS, 'data', { requirements: ['nosuchpkg'] });
    const building = builder.build(request(['nosuchpkg']));
    building.catch(() => undefined);
    await driveBuildPod(1, 'ERROR: Could not find a version that satisfies the requirement nosuchpkg\n');
    const err = await building.then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(BuildFailedError);
    expect((err as Error).message).toMatch(/pip install failed \(exit 1\): ERROR: Could not find a version that satisfies the requirement nosuchpkg/);
    const status = fake.get('jobtypes', NS, 'data')!.status as JobTypeStatus;
    expect(status.conditions?.find((c) => c.type === 'Failed')).toMatchObject({ status: 'True', reason: 'BuildFailed', message: expect.stringContaining('nosuchpkg') });
    expect(status.conditions?.find((c) => c.type === 'Ready')).toMatchObject({ status: 'False' });
    await fake.waitFor(() => !fake.list('jobs', RUNS).some((j) => j.metadata.labels?.[BUILD_LABEL]));
  });

  it('an executor image the registry does not have fails before any Job is created', async () => {
    const builder = await start({ executor_image: `${reg.host}/sandpod/missing:v1` });
    const err = await builder.build(request(['tinypkg'])).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(BuildFailedError);
    expect((err as Error).message).toMatch(/reading manifest sandpod\/missing:v1 .*HTTP 404/);
    expect(fake.list('jobs', RUNS)).toEqual([]);
  });

  it('a hostile archive from the build pod is refused and nothing is pushed', async () => {
    const builder = await start();
    const pack = tar.pack();
    pack.entry({ name: '../../etc/cron.d/x', type: 'file' }, 'boom');
    pack.finalize();
    const chunks: Buffer[] = [];
    for await (const c of pack as unknown as AsyncIterable<Buffer>) chunks.push(c);
    fake.onExec((call) => (call.container === BUILD_CONTAINERS.hold && call.command[0] === 'tar' ? { stdout: Buffer.concat(chunks) } : undefined));
    const building = builder.build(request(['tinypkg'], [], 'hostile'));
    building.catch(() => undefined);
    await driveBuildPod(0);
    const err = await building.then(() => null, (e: unknown) => e);
    expect((err as Error).message).toMatch(/unsafe name/);
    const tags = await fetch(`http://${reg.host}/v2/sandpod/builds/hostile/tags/list`).then((r) => r.status);
    expect(tags).toBe(404);
  });

  it('without kubernetes.build_registry the runtime has no builder (the API answers 501)', async () => {
    fake = await FakeKube.start({ schedulePods: true });
    rt = await startRuntime(fake);
    expect(rt.builder).toBeUndefined();
  });
});
