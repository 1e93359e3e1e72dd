/**
 * Sessions on a real cluster (issue 19), under the gVisor RuntimeClass with `SANDPOD_E2E_GVISOR=1`:
 * the runtime's `openSession` makes the session's own pod; state lives across cells; files go in and
 * out through the pod's collector (links never followed); the escape probe inside a cell (/code and
 * /input read-only, not root, no service-account token, no writes outside /tmp, /output and
 * /workspace, no DNS); a timed-out cell is interrupted and the state survives; a second runtime
 * instance adopts the live pod and the state is still there; an OOM kill ends the sandbox `oom`.
 * Then the session pool (warm_pool.session_sizes): a runtime keeping one ready session pod of
 * `default` hands it to the next session (`warm`, the very pod, its Job `sps-p-…` now labelled with
 * the session id); state lives across its cells, the escape probe holds inside it, and a second
 * runtime instance adopts it.
 *
 * Same variables as kubernetes.test.ts (`SANDPOD_E2E_KUBECONFIG`, `SANDPOD_E2E_IMAGE`, `SANDPOD_E2E_GVISOR`).
 */
import { randomUUID } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { BatchV1Api, CoreV1Api, KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../src/config.ts';
import { SESSION_POOL_LABELS } from '../../src/runtime/kubernetes/session/session-pool-plan.ts';
import { KubernetesJobTypeRegistry } from '../../src/jobtypes/kubernetes-registry.ts';
import { createKubernetesRuntime } from '../../src/runtime/kubernetes/index.ts';
import type { Runtime } from '../../src/runtime/runtime.ts';
import type { KubeSessionSandbox } from '../../src/runtime/kubernetes/session/session-sandbox.ts';
import type { CellSpec, SessionSandbox } from '../../src/runtime/session.ts';
import { applyObjects, manifestObjects } from '../support/kube-apply.ts';

const KUBECONFIG = process.env.SANDPOD_E2E_KUBECONFIG;
const IMAGE = process.env.SANDPOD_E2E_IMAGE ?? 'ghcr.io/sandpod/executor:0.1.0';
const GVISOR = process.env.SANDPOD_E2E_GVISOR === '1';
const NS = 'sandpod-e2e';
const RUNS_NS = 'sandpod-e2e-jobs';

const PROBE = String.raw`
import json, os, socket
r = {"uid": os.getuid(), "cwd": os.getcwd()}
def attempt(name, f):
    try:
        f()
        r[name] = "allowed"
    except OSError:
        r[name] = "refused"
for p in os.listdir("/code"):
    attempt("code w " + p, lambda p=p: open("/code/" + p, "r+").close())
attempt("code create", lambda: open("/code/new.py", "w").close())
attempt("input w", lambda: open("/input/data.json", "w").close())
attempt("input create", lambda: open("/input/x", "w").close())
for d in ["/", "/etc", "/usr", "/sandpod", "/code", "/input"]:
    attempt("write " + d, lambda d=d: open(os.path.join(d, "sp-escape"), "w").close())
attempt("write /tmp", lambda: open("/tmp/sp-escape", "w").close())
attempt("write /workspace", lambda: open("/workspace/sp-escape", "w").close())
attempt("dns", lambda: socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443))
r["sa token"] = os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")
r["kube env"] = [k for k in os.environ if k.startswith("KUBERNETES")]
r["input n"] = json.load(open("/input/data.json"))["n"]
print(json.dumps(r))
`;

describe.skipIf(!KUBECONFIG)('sessions on a real cluster (needs SANDPOD_E2E_KUBECONFIG)', () => {
  let kc: KubeConfig;
  let registry: KubernetesJobTypeRegistry;
  const instance = `e2e-sess-${randomUUID().slice(0, 6)}`;
  const runtimes: Runtime[] = [];
  let rt: Runtime;
  let s: SessionSandbox;
  let cellNo = 0;
  const sessionId = randomUUID();

  const config: Config = parseConfig(
    {
      runtime: 'kubernetes',
      security_mode: GVISOR ? 'strict' : 'permissive',
      kubernetes: { namespace: NS, runs_namespace: RUNS_NS, instance, runtime_class: GVISOR ? 'gvisor-e2e' : 'no-such-runtime-class', executor_image: IMAGE, ttl_seconds_after_finished: 120, preflight: false, warm_pool_size: 0 },
    },
    {},
  );
  const start = async () => {
    const r = createKubernetesRuntime(config, { kubeConfig: kc });
    runtimes.push(r);
    await r.start();
    return r;
  };
  const cell = (sandbox: SessionSandbox, code: string, over: Partial<CellSpec> = {}) =>
    sandbox.runCell({ cell: ++cellNo, code, inputJson: '{"n": 3}', timeoutSec: 30, maxStdoutBytes: 32768, maxArtifactBytes: 5 * 1024 * 1024, ...over });

  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    const objs: KubernetesObject[] = manifestObjects([
      ...readdirSync(new URL('../../crds/', import.meta.url)).filter((f) => f.endsWith('.yaml')).map((f) => new URL(`../../crds/${f}`, import.meta.url)),
      ...['namespaces.yaml', 'runtimeclass.yaml', 'jobtypes.yaml'].map((f) => new URL(`./manifests/${f}`, import.meta.url)),
    ]);
    await applyObjects(kc, objs);
    registry = new KubernetesJobTypeRegistry(config, { kubeConfig: kc });
    await registry.start();
    rt = await start();
  }, 300_000);

  afterAll(async () => {
    for (const r of runtimes) await r.stop();
    await registry?.stop();
    await kc
      ?.makeApiClient(BatchV1Api)
      .deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance}`, propagationPolicy: 'Background' })
      .catch(() => undefined);
  });

  it('a session pod under the RuntimeClass: state across cells, files in and out, links not followed', async () => {
    const t0 = Date.now();
    s = await rt.openSession!(registry.get('default')!, { maxStreamBytes: 32768, startupMs: 240_000, sessionId, lifetimeSec: 900 });
    const openMs = Date.now() - t0;
    const pods = (await kc.makeApiClient(CoreV1Api).listNamespacedPod({ namespace: RUNS_NS, labelSelector: `sandpod.io/session-id=${sessionId}` })).items;
    expect(pods).toHaveLength(1);
    if (GVISOR) expect(pods[0]!.spec?.runtimeClassName).toBe('gvisor-e2e');
    const c1 = await cell(s, 'rows = [1, 2, 3]\nopen("made.txt", "w").write("from a cell")\nprint("loaded")');
    expect(c1.stdout).toBe('loaded\n');
    await s.files!.write('in.csv', Buffer.from('a,b\n3,4\n'), 1 << 20);
    const c2 = await cell(s, 'import json\nprint(sum(rows), open("in.csv").read().split()[1])\njson.dump({"ok": True}, open("/output/result.json", "w"))\nopen("/output/art.txt", "w").write("x")\nimport os\nos.symlink("/etc/passwd", "link")');
    expect(c2.observation).toMatchObject({ exitCode: 0 });
    expect(c2.stdout).toBe('6 3,4\n');
    expect(c2.resultJson).toBe('{"ok": true}');
    expect(c2.artifacts.map((a) => a.name)).toEqual(['art.txt']);
    const c3 = await cell(s, 'import os\nprint(sorted(os.listdir("/output")))');
    expect(c3.stdout).toBe('[]\n');
    expect((await s.files!.read('made.txt', 1 << 20, true)).data?.toString()).toBe('from a cell');
    expect((await s.files!.list()).map((f) => f.name)).toEqual(['in.csv', 'made.txt']);
    await expect(s.files!.read('link', 1 << 20, true)).rejects.toMatchObject({ status: 409 });
    await expect(s.files!.write('link', Buffer.from('over'), 1 << 20)).rejects.toMatchObject({ status: 409 });
    await expect(s.files!.read('nope', 1 << 20, true)).rejects.toMatchObject({ status: 404 });
    console.log(`session pod ready in ${openMs} ms; cells ${c1.observation.totalMs}/${c2.observation.totalMs}/${c3.observation.totalMs} ms`);
  }, 600_000);

  it('the escape probe inside a cell: /code and /input read-only, not root, no service-account token, no DNS', async () => {
    const r = await cell(s, PROBE);
    expect(r.observation.exitCode, r.stderr).toBe(0);
    const p = JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
    expect(p.uid).toBe(1000);
    expect(p.cwd).toBe('/workspace');
    for (const [k, val] of Object.entries(p)) if (k.startsWith('code w ') || k.startsWith('write /') && !['write /tmp', 'write /workspace'].includes(k)) expect(val, k).toBe('refused');
    expect(p).toMatchObject({ 'code create': 'refused', 'input w': 'refused', 'input create': 'refused', 'write /tmp': 'allowed', 'write /workspace': 'allowed', dns: 'refused', 'sa token': false, 'kube env': [], 'input n': 3 });
  }, 120_000);

  it('a timed-out cell is interrupted and the state survives', async () => {
    const r = await cell(s, 'import time\nwhile True: time.sleep(0.05)', { timeoutSec: 2 });
    expect(r.observation.timedOut).toBe('execution');
    expect(s.ended).toBeNull();
    expect((await cell(s, 'print(sum(rows))')).stdout).toBe('6\n');
  }, 120_000);

  it('another runtime instance adopts the live pod: the state is still there', async () => {
    s.release!();
    const other = await start();
    const adopted = await other.adoptSession!(sessionId);
    expect(adopted).not.toBeNull();
    expect((await cell(adopted!, 'print(sum(rows) + 1)')).stdout).toBe('7\n');
    s = adopted!;
  }, 240_000);

  it('an OOM kill ends the session oom', async () => {
    const r = await cell(s, 'b = []\nwhile True: b.append(bytearray(8 << 20))', { timeoutSec: 60 });
    console.log('oom cell', JSON.stringify(r.observation), r.stderr.slice(-300), JSON.stringify(s.ended));
    expect(s.ended?.reason).toBe('oom');
    expect(r.observation.oomKilled).toBe(true);
    await s.destroy();
  }, 240_000);
});

describe.skipIf(!KUBECONFIG)('a session from the session pool on a real cluster (needs SANDPOD_E2E_KUBECONFIG)', () => {
  let kc: KubeConfig;
  let registry: KubernetesJobTypeRegistry;
  const instance = `e2e-spool-${randomUUID().slice(0, 6)}`;
  const runtimes: Runtime[] = [];
  let pooled: Runtime;
  let s: SessionSandbox;
  let cellNo = 0;
  const sessionId = randomUUID();
  const config: Config = parseConfig(
    {
      runtime: 'kubernetes',
      security_mode: GVISOR ? 'strict' : 'permissive',
      warm_pool: { session_sizes: { default: 1 } },
      kubernetes: { namespace: NS, runs_namespace: RUNS_NS, instance, runtime_class: GVISOR ? 'gvisor-e2e' : 'no-such-runtime-class', executor_image: IMAGE, ttl_seconds_after_finished: 120, preflight: false, warm_pool_size: 0 },
    },
    {},
  );
  const cell = (sandbox: SessionSandbox, code: string, over: Partial<CellSpec> = {}) =>
    sandbox.runCell({ cell: ++cellNo, code, inputJson: '{"n": 3}', timeoutSec: 30, maxStdoutBytes: 32768, maxArtifactBytes: 5 * 1024 * 1024, ...over });
  const pods = async (selector: string) => (await kc.makeApiClient(CoreV1Api).listNamespacedPod({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance},${selector}` })).items;

  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    registry = new KubernetesJobTypeRegistry(config, { kubeConfig: kc });
    await registry.start();
    // The pool needs the job types; the session pool only (warm_pool_size 0: no run pool).
    pooled = createKubernetesRuntime(config, { kubeConfig: kc, jobTypes: () => registry.list() });
    runtimes.push(pooled);
    await pooled.start();
  }, 300_000);

  afterAll(async () => {
    for (const r of runtimes) await r.stop();
    await registry?.stop();
    await kc
      ?.makeApiClient(BatchV1Api)
      .deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance}`, propagationPolicy: 'Background' })
      .catch(() => undefined);
  });

  it('the session takes the ready pooled pod: warm, that very pod, its Job labelled with the session; state across cells', async () => {
    const t0 = Date.now();
    while (((pooled.sessionPoolStats!().find((x) => x.job_type === 'default')?.ready) ?? 0) < 1) {
      if (Date.now() - t0 > 240_000) throw new Error(`no pooled session pod ready in 240 s: ${JSON.stringify(pooled.sessionPoolStats!())}`);
      await new Promise((r) => setTimeout(r, 250));
    }
    const readyMs = Date.now() - t0;
    const waiting = (await pods(`${SESSION_POOL_LABELS.pool}=default,!sandpod.io/session-id`)).filter((p) => !p.metadata?.deletionTimestamp);
    expect(waiting).toHaveLength(1);
    const t1 = Date.now();
    s = await pooled.openSession!(registry.get('default')!, { maxStreamBytes: 32768, startupMs: 240_000, sessionId, lifetimeSec: 900 });
    const openMs = Date.now() - t1;
    expect(s.warm).toBe(true);
    const k = s as KubeSessionSandbox;
    expect(k.podName).toBe(waiting[0]!.metadata!.name);
    expect(k.jobName).toMatch(/^sps-p-/);
    const mine = await pods(`sandpod.io/session-id=${sessionId}`);
    expect(mine.map((p) => p.metadata?.name)).toEqual([k.podName]);
    if (GVISOR) expect(mine[0]!.spec?.runtimeClassName).toBe('gvisor-e2e');
    const job = await kc.makeApiClient(BatchV1Api).readNamespacedJob({ namespace: RUNS_NS, name: k.jobName });
    expect(job.metadata?.labels?.['sandpod.io/session-id']).toBe(sessionId);
    expect(job.spec?.activeDeadlineSeconds).toBeGreaterThanOrEqual(900);
    expect((await cell(s, 'rows = [1, 2, 3]\nprint("loaded")')).stdout).toBe('loaded\n');
    await s.files!.write('in.csv', Buffer.from('a,b\n3,4\n'), 1 << 20);
    expect((await cell(s, 'print(sum(rows), open("in.csv").read().split()[1])')).stdout).toBe('6 3,4\n');
    console.log(`pooled session pod ready ${readyMs} ms after the runtime started; open from the pool ${openMs} ms; stats ${JSON.stringify(pooled.sessionPoolStats!())}`);
  }, 600_000);

  it('the escape probe inside a cell of the pool-taken session', async () => {
    const r = await cell(s, PROBE);
    expect(r.observation.exitCode, r.stderr).toBe(0);
    const p = JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
    expect(p.uid).toBe(1000);
    expect(p.cwd).toBe('/workspace');
    for (const [k, val] of Object.entries(p)) if (k.startsWith('code w ') || (k.startsWith('write /') && !['write /tmp', 'write /workspace'].includes(k))) expect(val, k).toBe('refused');
    expect(p).toMatchObject({ 'code create': 'refused', 'input w': 'refused', 'input create': 'refused', 'write /tmp': 'allowed', 'write /workspace': 'allowed', dns: 'refused', 'sa token': false, 'kube env': [], 'input n': 3 });
  }, 120_000);

  it('another runtime instance adopts the pool-taken session: the same pod and Job, the state kept; its close deletes that Job', async () => {
    const k = s as KubeSessionSandbox;
    s.release!();
    const other = createKubernetesRuntime(config, { kubeConfig: kc });
    runtimes.push(other);
    await other.start();
    const adopted = (await other.adoptSession!(sessionId)) as KubeSessionSandbox | null;
    expect(adopted).not.toBeNull();
    expect(adopted!.podName).toBe(k.podName);
    expect(adopted!.jobName).toBe(k.jobName);
    expect((await cell(adopted!, 'print(sum(rows) + 1)')).stdout).toBe('7\n');
    await adopted!.destroy();
    const batch = kc.makeApiClient(BatchV1Api);
    const t0 = Date.now();
    for (;;) {
      const j = await batch.readNamespacedJob({ namespace: RUNS_NS, name: k.jobName }).catch(() => null);
      if (!j || j.metadata?.deletionTimestamp) break;
      if (Date.now() - t0 > 30_000) throw new Error('the claimed Job was not deleted');
      await new Promise((r) => setTimeout(r, 250));
    }
  }, 240_000);
});
