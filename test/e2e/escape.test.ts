/**
 * The escape tests on every path to a cluster sandbox (issue 23): a cold pod (code and input from the
 * run's Secret), a warm pool pod and a cold attach pod (code and input written by the collector, see
 * pool-plan.ts) must keep the same promises under the same RuntimeClass (real gVisor with
 * `SANDPOD_E2E_GVISOR=1`):
 *
 * - /code and /input are read-only in the kernel's sense: opening for writing, creating, chmod,
 *   unlinking and truncating fail, and the input still parses afterwards (SPEC §1.5);
 * - nothing outside /tmp and /output can be written (read-only root file system);
 * - no network: names do not resolve, and, when `SANDPOD_E2E_RUNTIME_CLASS_NETWORK_NONE` names a
 *   RuntimeClass whose runsc runs with `--network=none` (the suite applies it with handler
 *   `SANDPOD_E2E_NETWORK_NONE_HANDLER`, default `runsc-nonet`), the API server's ClusterIP cannot
 *   be reached either (kcluster's bridge does not enforce NetworkPolicy, so without such a class that
 *   part is not asserted);
 * - `kubectl logs <pod> -c main` shows the program's stdout and stderr, and nothing of the runner's.
 *
 * Same variables as kubernetes.test.ts (`SANDPOD_E2E_KUBECONFIG`, `SANDPOD_E2E_IMAGE`, `SANDPOD_E2E_GVISOR`).
 */
import { randomUUID } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { BatchV1Api, CoreV1Api, KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../src/config.ts';
import { KubernetesJobTypeRegistry } from '../../src/jobtypes/kubernetes-registry.ts';
import { createKubernetesRuntime } from '../../src/runtime/kubernetes/index.ts';
import type { Runtime, RunSpec } from '../../src/runtime/runtime.ts';
import { applyObjects, manifestObjects } from '../support/kube-apply.ts';

const KUBECONFIG = process.env.SANDPOD_E2E_KUBECONFIG;
const IMAGE = process.env.SANDPOD_E2E_IMAGE ?? 'ghcr.io/sandpod/executor:0.1.0';
const GVISOR = process.env.SANDPOD_E2E_GVISOR === '1';
const NONET = process.env.SANDPOD_E2E_RUNTIME_CLASS_NETWORK_NONE;
const NONET_HANDLER = process.env.SANDPOD_E2E_NETWORK_NONE_HANDLER ?? 'runsc-nonet';
const NS = 'sandpod-e2e';
const RUNS_NS = 'sandpod-e2e-jobs';

/** The program: tries each escape and prints what happened, one JSON object on its last line. */
const ESCAPE = String.raw`
import json, os, socket, sys
print("kubectl-visible")
print("to-stderr", file=sys.stderr)
r = {}
def attempt(name, f):
    try:
        f()
        r[name] = "allowed"
    except OSError as e:
        r[name] = "refused"
attempt("code r+", lambda: open("/code/main.py", "r+").close())
attempt("code create", lambda: open("/code/new.py", "w").close())
attempt("code chmod", lambda: os.chmod("/code/main.py", 0o777))
attempt("code unlink", lambda: os.unlink("/code/main.py"))
attempt("code mkdir", lambda: os.mkdir("/code/d"))
attempt("input w", lambda: open("/input/data.json", "w").close())
attempt("input r+ truncate", lambda: open("/input/data.json", "r+").truncate(0))
attempt("input create", lambda: open("/input/x", "w").close())
attempt("input rename", lambda: os.rename("/input/data.json", "/input/y"))
for d in ["/", "/etc", "/usr", "/var", "/home", "/root", "/sandpod", "/opt"]:
    attempt("write " + d, lambda d=d: open(os.path.join(d, "sp-escape"), "w").close())
attempt("write /tmp", lambda: open("/tmp/sp-escape", "w").close())
attempt("write /output", lambda: open("/output/sp-escape", "w").close())
r["input n"] = json.load(open("/input/data.json"))["n"]
r["code intact"] = open("/code/main.py").read().startswith("\nimport json, os, socket, sys")
attempt("dns", lambda: socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443))
def api():
    socket.create_connection(("10.96.0.1", 443), timeout=3).close()
attempt("api clusterip", api)
print(json.dumps(r))
`;

const REFUSED = ['code r+', 'code create', 'code chmod', 'code unlink', 'code mkdir', 'input w', 'input r+ truncate', 'input create', 'input rename', 'dns'];
const WRITES = ['/', '/etc', '/usr', '/var', '/home', '/root', '/sandpod', '/opt'];

describe.skipIf(!KUBECONFIG)('escape tests on every cluster path (needs SANDPOD_E2E_KUBECONFIG)', () => {
  let kc: KubeConfig;
  let registry: KubernetesJobTypeRegistry;
  const base = `e2e-esc-${randomUUID().slice(0, 6)}`;
  const runtimes: Runtime[] = [];

  const configFor = (path: 'cold' | 'warm' | 'attach'): Config =>
    parseConfig(
      {
        runtime: 'kubernetes',
        security_mode: GVISOR ? 'strict' : 'permissive',
        kubernetes: {
          namespace: NS,
          runs_namespace: RUNS_NS,
          instance: `${base}-${path}`,
          runtime_class: GVISOR ? 'gvisor-e2e' : 'no-such-runtime-class',
          ...(NONET ? { runtime_class_network_none: NONET } : {}),
          executor_image: IMAGE,
          ttl_seconds_after_finished: 120,
          preflight: false,
          warm_pool_size: path === 'warm' ? 1 : 0,
          cold_start: path === 'attach' ? 'attach' : 'secret',
        },
      },
      {},
    );

  const spec = (code: string): RunSpec => {
    const jobType = registry.get('default')!;
    return { executionId: randomUUID(), code, inputJson: '{"n": 3}', jobType, timeoutSec: 60, startupTimeoutSec: 180, requirements: [], maxStdoutBytes: 32768, maxArtifactBytes: 5 * 1024 * 1024 };
  };

  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    const objs: KubernetesObject[] = manifestObjects([
      ...readdirSync(new URL('../../crds/', import.meta.url)).filter((f) => f.endsWith('.yaml')).map((f) => new URL(`../../crds/${f}`, import.meta.url)),
      ...['namespaces.yaml', 'runtimeclass.yaml', 'jobtypes.yaml'].map((f) => new URL(`./manifests/${f}`, import.meta.url)),
    ]);
    if (NONET) objs.push({ apiVersion: 'node.k8s.io/v1', kind: 'RuntimeClass', metadata: { name: NONET }, handler: NONET_HANDLER } as KubernetesObject);
    await applyObjects(kc, objs);
    registry = new KubernetesJobTypeRegistry(configFor('cold'), { kubeConfig: kc });
    await registry.start();
  }, 300_000);

  afterAll(async () => {
    for (const r of runtimes) await r.stop();
    await registry?.stop();
    const batch = kc?.makeApiClient(BatchV1Api);
    for (const p of ['cold', 'warm', 'attach']) {
      await batch?.deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${base}-${p}`, propagationPolicy: 'Background' }).catch(() => undefined);
    }
  });

  it.each(['cold', 'warm', 'attach'] as const)('%s pods: code and input read-only, no writes outside /tmp and /output, no network, main log is the program', async (path) => {
    const cfg = configFor(path);
    const r = createKubernetesRuntime(cfg, { kubeConfig: kc, jobTypes: () => registry.list().filter((t) => t.name === 'default'), tuning: { poolIntervalMs: 500 } });
    runtimes.push(r);
    await r.start();
    if (path === 'warm') {
      const ready = () => r.warmPoolStats!().find((x) => x.job_type === 'default')?.ready ?? 0;
      for (let i = 0; i < 360 && ready() < 1; i++) await new Promise((res) => setTimeout(res, 500));
      expect(ready()).toBeGreaterThanOrEqual(1);
    }
    const s = spec(ESCAPE);
    const raw = await r.run(s);
    if (path === 'warm') expect(r.warmPoolStats!().find((x) => x.job_type === 'default')?.hits).toBe(1);
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    const lines = raw.stdout.trim().split('\n');
    expect(lines[0]).toBe('kubectl-visible');
    const result = JSON.parse(lines[lines.length - 1]!) as Record<string, unknown>;
    for (const k of REFUSED) expect(result[k], `${path}: ${k}`).toBe('refused');
    for (const d of WRITES) expect(result[`write ${d}`], `${path}: write ${d}`).toBe('refused');
    expect(result['write /tmp']).toBe('allowed');
    expect(result['write /output']).toBe('allowed');
    expect(result['input n']).toBe(3);
    expect(result['code intact']).toBe(true);
    if (NONET) expect(result['api clusterip'], `${path}: the API server's ClusterIP`).toBe('refused');

    // kubectl logs <pod> -c main: the program's stdout and stderr, nothing of the runner's.
    const core = kc.makeApiClient(CoreV1Api);
    const pods = (await core.listNamespacedPod({ namespace: RUNS_NS, labelSelector: `sandpod.io/execution-id=${s.executionId}` })).items;
    expect(pods).toHaveLength(1);
    let log = '';
    for (let i = 0; i < 20; i++) {
      log = await core.readNamespacedPodLog({ namespace: RUNS_NS, name: pods[0]!.metadata!.name!, container: 'main' }).catch(() => '');
      if (log.includes('}')) break;
      await new Promise((res) => setTimeout(res, 500));
    }
    expect(log).toContain('kubectl-visible\n');
    expect(log).toContain('to-stderr\n');
    expect(log.split('\n')).not.toContain('ready');
    expect(log.split('\n')).not.toContain('execution');
    expect(log).not.toMatch(/^done /m);
  }, 600_000);
});
