/**
 * Job-type builds on a real cluster (SPEC §4.9, issue #11). Skipped (visibly) unless
 * `SANDPOD_E2E_KUBECONFIG` names a kubeconfig and `SANDPOD_E2E_BUILD_BASE` names the executor image
 * in a registry the service and the node both reach, e.g. with kcluster:
 *
 *   kcluster registry up
 *   kcluster image python sandpod.local/executor:dev --runner /tmp/runner.py   (after: node --import tsx src/sandbox/write-runner.ts /tmp/runner.py)
 *   skopeo copy --dest-tls-verify=false docker-archive:$KCLUSTER_HOME/images/archives/sandpod.local_executor_dev.tar \
 *     docker://127.0.0.1:5000/sandpod/executor:dev
 *   SANDPOD_E2E_KUBECONFIG=$KUBECONFIG SANDPOD_E2E_BUILD_BASE=127.0.0.1:5000/sandpod/executor:dev npx vitest run test/e2e/build.test.ts
 *
 * Pods have no egress there: the wheels are served by this process on `SANDPOD_E2E_HOST_ADDR`
 * (default 10.244.0.1, kcluster's bridge) and pip uses them as `--find-links` with `--no-index`.
 * The build pushes to `SANDPOD_E2E_BUILD_REGISTRY` (default the base's registry, plain HTTP).
 *
 * What holds: the build Job installs the requirement unprivileged, the service pushes the layer by
 * digest, the JobType's status says Ready with the image digest, and a run of the built type pulls
 * that image by digest, imports the package and installs nothing (`depInstallMs` 0, no `deps`).
 */
import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { CustomObjectsApi, KubeConfig, KubernetesObjectApi, type KubernetesObject } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import YAML from 'yaml';
import { parseConfig, type Config } from '../../src/config.ts';
import { KubernetesJobTypeRegistry, type JobTypeStatus } from '../../src/jobtypes/kubernetes-registry.ts';
import { KubeApi } from '../../src/kube/index.ts';
import { createKubernetesRuntime } from '../../src/runtime/kubernetes/index.ts';
import { jobNameFor } from '../../src/runtime/kubernetes/names.ts';
import type { Runtime } from '../../src/runtime/runtime.ts';
import { buildWheels } from '../support/wheel.ts';

const KUBECONFIG = process.env.SANDPOD_E2E_KUBECONFIG;
const BASE = process.env.SANDPOD_E2E_BUILD_BASE;
const HOST_ADDR = process.env.SANDPOD_E2E_HOST_ADDR ?? '10.244.0.1';
const REGISTRY = process.env.SANDPOD_E2E_BUILD_REGISTRY ?? (BASE ? `${BASE.split('/')[0]}/sandpod-e2e/builds` : '');
const NS = 'sandpod-e2e';
const RUNS_NS = 'sandpod-e2e-jobs';

async function apply(kc: KubeConfig, objs: KubernetesObject[]): Promise<void> {
  const client = KubernetesObjectApi.makeApiClient(kc);
  for (const obj of objs) {
    for (let attempt = 0; ; attempt++) {
      try {
        const existing = await client.read(obj as never).catch(() => null);
        if (existing) await client.replace({ ...obj, metadata: { ...obj.metadata, resourceVersion: existing.metadata?.resourceVersion } } as never);
        else await client.create(obj);
        break;
      } catch (err) {
        if (attempt >= 20) throw err;
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }
}

/** Serves a directory of wheels as a find-links page (an HTML list of links). */
function serveWheels(dir: string): Promise<{ url: string; close: () => Promise<void> }> {
  const server = http.createServer((req, res) => {
    const name = decodeURIComponent((req.url ?? '/').replace(/^\/+/, '').split('?')[0]!);
    if (name === '') {
      const links = readdirSync(dir).filter((f) => f.endsWith('.whl')).map((f) => `<a href="${f}">${f}</a>`).join('\n');
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end(`<!doctype html><html><body>\n${links}\n</body></html>\n`);
      return;
    }
    if (name.includes('/') || !name.endsWith('.whl')) {
      res.writeHead(404).end();
      return;
    }
    try {
      const data = readFileSync(path.join(dir, name));
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': data.length });
      res.end(data);
    } catch {
      res.writeHead(404).end();
    }
  });
  return new Promise((resolve) =>
    server.listen(0, '0.0.0.0', () =>
      resolve({ url: `http://${HOST_ADDR}:${(server.address() as AddressInfo).port}/`, close: () => new Promise((r) => server.close(() => r())) }),
    ),
  );
}

describe.skipIf(!KUBECONFIG || !BASE)('kubernetes builds e2e (needs SANDPOD_E2E_KUBECONFIG and SANDPOD_E2E_BUILD_BASE; skipped without them)', () => {
  let kc: KubeConfig;
  let config: Config;
  let registry: KubernetesJobTypeRegistry;
  let rt: Runtime;
  let wheels: { url: string; close: () => Promise<void> };
  const instance = `e2eb-${randomUUID().slice(0, 8)}`;
  const typeName = `built-${randomUUID().slice(0, 6)}`;

  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    const crds = readdirSync(new URL('../../crds/', import.meta.url)).filter((f) => f.endsWith('.yaml')).map((f) => new URL(`../../crds/${f}`, import.meta.url));
    const docs = [...crds, new URL('./manifests/namespaces.yaml', import.meta.url)].flatMap((u) => YAML.parseAllDocuments(readFileSync(u, 'utf8')).map((d) => d.toJS() as KubernetesObject)).filter(Boolean);
    await apply(kc, docs);
    await apply(kc, [{ apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType', metadata: { name: typeName, namespace: NS }, spec: { requirements: ['e2e-tinypkg==1.0.0'], memoryLimit: '256m', cpuLimit: 0.5 } } as KubernetesObject]);
    wheels = await serveWheels(buildWheels([{ name: 'e2e-tinypkg', version: '1.0.0', modules: { '__init__.py': 'VALUE = "built in the cluster"\n' } }]));
    config = parseConfig(
      {
        runtime: 'kubernetes',
        security_mode: 'permissive',
        // Plain HTTP from the machine: pip wants the host named as trusted.
        pip: { find_links: [wheels.url], no_index: true, extra_args: ['--trusted-host', HOST_ADDR] },
        kubernetes: {
          namespace: NS,
          runs_namespace: RUNS_NS,
          instance,
          runtime_class: 'no-such-runtime-class',
          executor_image: BASE,
          image_pull_policy: 'IfNotPresent',
          ttl_seconds_after_finished: 120,
          preflight: false,
          build_registry: REGISTRY,
          build_registry_insecure: true,
          build_cpu: '500m',
          build_memory: '512Mi',
          build_ephemeral_storage: '1Gi',
        },
      },
      {},
    );
    registry = new KubernetesJobTypeRegistry(config, { kubeConfig: kc });
    await registry.start();
    for (let i = 0; i < 50 && !registry.get(typeName); i++) await new Promise((r) => setTimeout(r, 200));
    rt = createKubernetesRuntime(config, { kubeConfig: kc });
    await rt.start();
  }, 300_000);

  afterAll(async () => {
    await rt?.stop();
    await registry?.stop();
    await wheels?.close();
    await KubernetesObjectApi.makeApiClient(kc)
      .delete({ apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType', metadata: { name: typeName, namespace: NS } })
      .catch(() => undefined);
  });

  it('builds the type in the cluster and a run uses the image by digest, installing nothing', async () => {
    const jt = registry.get(typeName)!;
    expect(jt).toBeDefined();
    const phases: string[] = [];
    const t0 = Date.now();
    const env = await rt.builder!.build({ jobType: jt, requirements: jt.requirements, onProgress: (p) => phases.push(p), deadline: Date.now() + 240_000 });
    const buildMs = Date.now() - t0;
    expect(env.lock).toEqual([{ name: 'e2e-tinypkg', version: '1.0.0', sha256: expect.stringMatching(/^[a-f0-9]{64}$/) }]);
    expect(env.imageRef).toMatch(new RegExp(`^${REGISTRY.replace(/[.]/g, '\\.')}/${typeName}@sha256:[a-f0-9]{64}$`));
    expect(phases).toEqual(expect.arrayContaining(['resolving', 'installing', 'publishing']));

    // The JobType's status, as `kubectl get jobtypes` shows it.
    const custom = kc.makeApiClient(CustomObjectsApi);
    const obj = (await custom.getNamespacedCustomObject({ group: 'sandpod.io', version: 'v1alpha1', namespace: NS, plural: 'jobtypes', name: typeName })) as { status?: JobTypeStatus };
    expect(obj.status?.imageDigest).toBe(env.imageRef.split('@')[1]);
    expect(obj.status?.conditions?.find((c) => c.type === 'Ready')).toMatchObject({ status: 'True', reason: 'BuildSucceeded' });
    expect(obj.status?.conditions?.find((c) => c.type === 'Building')).toMatchObject({ status: 'False' });

    const built = { ...jt, build: { id: 'e2e', digest: env.digest, imageRef: env.imageRef, pythonVersion: env.pythonVersion, lock: env.lock, version: 'latest', builtAt: new Date() } };
    const executionId = randomUUID();
    const raw = await rt.run({
      executionId,
      code: 'import e2e_tinypkg, os\nprint(e2e_tinypkg.VALUE)\nprint(e2e_tinypkg.__file__)\n',
      inputJson: '{}',
      jobType: built,
      timeoutSec: 30,
      startupTimeoutSec: 180,
      requirements: [...jt.requirements],
      maxStdoutBytes: 32768,
      maxArtifactBytes: 1024 * 1024,
    });
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null, dependencyError: null, depInstallMs: 0 });
    expect(raw.stdout).toBe('built in the cluster\n/sandpod-env/site/e2e_tinypkg/__init__.py\n');
    const job = await new KubeApi(kc).getJob(RUNS_NS, jobNameFor(executionId));
    // The run's Job may be gone after its TTL; when it is there it shows the image and no deps container.
    if (job) {
      expect(job.spec?.template.spec?.containers[0]?.image).toBe(env.imageRef);
      expect(job.spec?.template.spec?.initContainers ?? []).toEqual([]);
    }
    console.log(`e2e build: ${buildMs} ms, image ${env.imageRef}`);
  }, 400_000);
});
