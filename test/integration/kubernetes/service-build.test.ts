/**
 * `POST /job-types/{name}/build` through the whole service on the Kubernetes runtime (main.ts wiring,
 * KUBECONFIG → the in-repo fake API server), with a real OCI registry and a real pip install behind
 * the fake's exec: the answer names the image by digest, `GET /job-types/{name}` shows it, the
 * JobType resource gets its status, and a job of the built type runs that image with no `deps`.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BUILD_CONTAINERS, BUILD_LABEL } from '../../../src/runtime/kubernetes/builds/build-env-job.ts';
import { RegistryClient } from '../../../src/runtime/kubernetes/builds/build-registry.ts';
import { jobNameFor } from '../../../src/runtime/kubernetes/names.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube } from '../../support/fake-kube/server.ts';
import { useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { hasRegistry, pushBase, startRegistry, type TestRegistry } from '../../support/oci-registry.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { buildWheels } from '../../support/wheel.ts';

type J = Record<string, any>;

describe.skipIf(!hasRegistry)('service on the kubernetes runtime: job-type builds', () => {
  let fake: FakeKube;
  let reg: TestRegistry;
  let database: TestDatabase;
  let svc: TestService;
  let restore: (() => void) | undefined;
  let work: string;
  let archive: Buffer;

  beforeAll(async () => {
    reg = await startRegistry();
    work = mkdtempSync(path.join(tmpdir(), 'svc-build-'));
    await pushBase(new RegistryClient(reg.host, { insecure: true }), work, 'sandpod/executor');
    const wheels = buildWheels([{ name: 'svcpkg', version: '1.2.3' }]);
    const dir = path.join(work, 'pip');
    mkdirSync(dir);
    execFileSync('python3', ['-m', 'pip', 'install', '--quiet', '--no-index', '--find-links', wheels, '--no-compile', '--target', path.join(dir, 'site'), '--report', path.join(dir, 'report.json'), 'svcpkg==1.2.3'], { stdio: 'ignore' });
    archive = execFileSync('tar', ['-C', dir, '-cf', '-', 'site', 'report.json']);
    fake = await FakeKube.start({ schedulePods: true });
    fake.upsertJobType('sandpod', 'svcbuilt', { pythonVersion: '3.11', requirements: ['svcpkg==1.2.3'], memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
    fake.onExec((call) => (call.container === BUILD_CONTAINERS.hold && call.command[0] === 'tar' ? { stdout: archive } : undefined));
    restore = useFakeKubeconfig(fake);
    database = await freshDatabase();
    svc = await startTestService(
      {
        runtime: 'kubernetes',
        security_mode: 'permissive',
        kubernetes: { executor_image: `${reg.host}/sandpod/executor:v1`, watch_job_types: true, preflight: false, build_registry: `${reg.host}/sandpod/builds`, build_registry_insecure: true },
      },
      {},
      database,
    );
  });
  afterAll(async () => {
    await svc?.close();
    await database?.drop();
    await fake?.close();
    await reg?.stop();
    restore?.();
    rmSync(work, { recursive: true, force: true });
  });

  it('builds by digest, shows it, writes the JobType status, and runs the built image installing nothing', async () => {
    const answer = svc.post('/job-types/svcbuilt/build?version_tag=1.0.0');
    let pod = '';
    await fake.waitFor(() => {
      pod = fake.list('pods', 'sandpod-jobs').find((p) => p.metadata.labels?.[BUILD_LABEL] === 'svcbuilt')?.metadata.name ?? '';
      return pod !== '';
    }, 20_000);
    fake.updatePod(pod, (p) => {
      p.status.initContainerStatuses = [{ name: 'pip', image: '', imageID: '', ready: false, restartCount: 0, state: { terminated: { exitCode: 0, reason: 'Completed' } } }];
      p.status.containerStatuses = [{ name: 'hold', image: '', imageID: '', ready: true, restartCount: 0, started: true, state: { running: {} } }];
    });
    const res = await answer;
    const b = (await res.json()) as J;
    expect(res.status, JSON.stringify(b)).toBe(200);
    expect(b).toMatchObject({ status: 'built', job_type: 'svcbuilt', version_tag: '1.0.0', error: null, resolved_requirements: [{ name: 'svcpkg', version: '1.2.3' }] });
    expect(b.image_ref).toMatch(new RegExp(`^${reg.host.replace(/\./g, '\\.')}/sandpod/builds/svcbuilt@sha256:[0-9a-f]{64}$`));
    expect(b.version).toBe(`svcbuilt@sha256:${b.digest}`);

    const view = (await (await svc.get('/job-types/svcbuilt')).json()) as J;
    expect(view).toMatchObject({ image_exists: true, version: '1.0.0', digest: b.digest, image_ref: b.image_ref });
    const status = fake.get('jobtypes', 'sandpod', 'svcbuilt')!.status;
    expect(status.imageDigest).toBe(b.image_ref.split('@')[1]);
    expect(status.conditions.find((c: J) => c.type === 'Ready').status).toBe('True');

    const submitted = (await (await svc.post('/execute/async', { code: 'import svcpkg', job_type: 'svcbuilt' })).json()) as J;
    const id = submitted.job_id as string;
    await fake.waitFor(() => !!fake.get('jobs', 'sandpod-jobs', jobNameFor(id)), 20_000);
    const job = fake.get('jobs', 'sandpod-jobs', jobNameFor(id))!;
    expect(job.spec.template.spec.containers[0].image).toBe(b.image_ref);
    expect(job.spec.template.spec.initContainers ?? []).toEqual([]);
    expect(job.metadata.annotations?.['sandpod.io/job-ref']).toBe(b.version);
    await svc.post(`/jobs/${id}/cancel`);
  }, 120_000);
});
