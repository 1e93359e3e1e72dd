/**
 * sandpod on a real cluster against the bare Job floor measured in the same run (issue #10):
 * - floor: a bare batch/v1 Job with the executor image running `python3 -c 'print(1)'`, from the
 *   create call to the moment its pod is seen `Succeeded` (sequential, one at a time);
 * - for reference, the same bare Job with one emptyDir at /tmp (see {@link bareJob}): what the kubelet's
 *   wait for a pod's volumes adds; every run's pod has volumes, the floor none;
 * - sandpod cold: `POST /execute {"code": "print(1)"}` through HTTP to a service (real PostgreSQL,
 *   the Kubernetes runtime) running on this machine against the same cluster;
 * - sandpod warm: the same request against a service keeping a warm pool of 2 for `default`
 *   (runtime/kubernetes/pool/pool.ts): the run claims an idle pool pod, hands it the program by attach and
 *   ends on the runner's `done` line (hits and misses counted from /pool/stats); once settled (the
 *   pool full again before each run: the target's measure) and once back to back (the refill of the
 *   pod just claimed boots beside the next run on the same two cores);
 * - where the time goes: a pod watch stamps each run's pod as it is created, scheduled, its
 *   containers start, `main` ends and the pod leaves, so the report splits the wall time by stage
 *   (Kubernetes timestamps have whole-second resolution; the watch's receive times do not).
 *
 * - sandpod warm `data` (issue 18): with `SANDPOD_BENCH_DATA_IMAGE` (an executor image with Debian's
 *   numpy and pandas), a JobType on that image preloading both, pool of 2, running
 *   `import pandas as pd; print(pd.DataFrame({"a": [1, 2]}).a.sum())`.
 *
 * Needs `SANDPOD_BENCH_KUBECONFIG` (or `SANDPOD_E2E_KUBECONFIG`) and `SANDPOD_BENCH_IMAGE` (or
 * `SANDPOD_E2E_IMAGE`), the executor image the node can run; says so and skips without them. Applies
 * the e2e suite's CRDs, namespaces and JobTypes (test/e2e/manifests) and runs in those namespaces.
 * `SANDPOD_BENCH_GVISOR=1` (or `SANDPOD_E2E_GVISOR=1`): floor, cold and warm pods all run under the
 * `gvisor` RuntimeClass (`kcluster up --gvisor`), the service in strict mode.
 * Targets (issue 18): warm p50 ≤ 150 ms, data warm p50 ≤ 250 ms, cold p50 ≤ 1.0 × the floor's.
 */
import { randomUUID } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { BatchV1Api, CustomObjectsApi, KubeConfig, Watch, type KubernetesObject, type V1Pod } from '@kubernetes/client-node';
import { parseConfig } from '../src/config.ts';
import { silentLogger } from '../src/logger.ts';
import { createService, listen } from '../src/main.ts';
import { jobNameFor } from '../src/runtime/kubernetes/names.ts';
import { freshDatabase } from '../test/support/db.ts';
import { applyObjects, manifestObjects } from '../test/support/kube-apply.ts';
import { getJson, postJson } from './http.ts';
import { ms, quantile } from './stats.ts';

const NS = 'sandpod-e2e';
const RUNS_NS = 'sandpod-e2e-jobs';
const GVISOR = (process.env.SANDPOD_BENCH_GVISOR ?? process.env.SANDPOD_E2E_GVISOR) === '1';
/** The RuntimeClass of every pod here (`kcluster up --gvisor` makes `gvisor`), or none. */
const RUNTIME_CLASS = GVISOR ? 'gvisor' : null;
const DATA_IMAGE = process.env.SANDPOD_BENCH_DATA_IMAGE;
const DATA_CODE = 'import pandas as pd; print(pd.DataFrame({"a": [1, 2]}).a.sum())';
const WARM_TARGET_MS = 150;
const DATA_WARM_TARGET_MS = 250;
const COLD_TARGET_RATIO = 1.0;

/** Options of {@link benchCluster}. */
export interface ClusterBenchOptions {
  runs: number;
  say: (line: string) => void;
}

/** Local receive times (ms, performance.now) of one pod's stages. */
interface PodStamps {
  created?: number;
  scheduled?: number;
  running?: number;
  mainEnded?: number;
  done?: number;
  deleted?: number;
}

function manifests(): KubernetesObject[] {
  const crds = new URL('../crds/', import.meta.url);
  return manifestObjects([
    ...readdirSync(crds).filter((f) => f.endsWith('.yaml')).map((f) => new URL(f, crds)),
    ...['namespaces.yaml', 'jobtypes.yaml'].map((f) => new URL(`../test/e2e/manifests/${f}`, import.meta.url)),
  ]);
}

/** Watches the runs namespace's pods and stamps each one's stages, keyed by its `job-name` label. */
async function stampPods(kc: KubeConfig): Promise<{ stamps: Map<string, PodStamps>; stop: () => void }> {
  const stamps = new Map<string, PodStamps>();
  const watch = new Watch(kc);
  const req = await watch.watch(
    `/api/v1/namespaces/${RUNS_NS}/pods`,
    {},
    (type: string, pod: V1Pod) => {
      const now = performance.now();
      const job = pod.metadata?.labels?.['job-name'];
      if (!job) return;
      const s = stamps.get(job) ?? {};
      stamps.set(job, s);
      s.created ??= now;
      if (pod.spec?.nodeName) s.scheduled ??= now;
      const statuses = pod.status?.containerStatuses ?? [];
      if (statuses.some((c) => c.state?.running || c.state?.terminated)) s.running ??= now;
      const main = statuses.find((c) => c.name === 'main') ?? (statuses.length === 1 ? statuses[0] : undefined);
      if (main?.state?.terminated) s.mainEnded ??= now;
      if (pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed') s.done ??= now;
      if (type === 'DELETED' || pod.metadata?.deletionTimestamp) s.deleted ??= now;
    },
    () => undefined,
  );
  return { stamps, stop: () => req.abort() };
}

async function waitFor(cond: () => boolean, timeoutMs: number): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!cond()) {
    if (performance.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 5));
  }
}

/**
 * One bare Job: create → pod Succeeded (ms), then deleted. With `emptyDir`, its container mounts one
 * emptyDir at /tmp (the least a run's pod has: a sandbox with a read-only root needs somewhere to
 * write), which makes the kubelet wait for the pod's volumes before it starts the sandbox: it checks
 * them at once and then every 300 ms (kubelet `WaitForAttachAndMount`), and the first check comes
 * before its 100 ms mount loops have mounted anything; a pod without volumes skips the wait.
 */
async function bareJob(batch: BatchV1Api, image: string, stamps: Map<string, PodStamps>, emptyDir = false): Promise<{ total: number; s: PodStamps; t0: number }> {
  const name = `bench-floor-${randomUUID().slice(0, 8)}`;
  const t0 = performance.now();
  await batch.createNamespacedJob({
    namespace: RUNS_NS,
    body: {
      metadata: { name },
      spec: {
        backoffLimit: 0,
        template: {
          spec: {
            restartPolicy: 'Never',
            ...(RUNTIME_CLASS ? { runtimeClassName: RUNTIME_CLASS } : {}),
            automountServiceAccountToken: false,
            enableServiceLinks: false,
            securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, seccompProfile: { type: 'RuntimeDefault' } },
            ...(emptyDir ? { volumes: [{ name: 'tmp', emptyDir: {} }] } : {}),
            containers: [
              {
                name: 'main',
                image,
                imagePullPolicy: 'IfNotPresent',
                command: ['python3', '-c', 'print(1)'],
                ...(emptyDir ? { volumeMounts: [{ name: 'tmp', mountPath: '/tmp' }] } : {}),
                securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } },
                resources: { limits: { cpu: '500m', memory: '256Mi' }, requests: { cpu: '500m', memory: '256Mi' } },
              },
            ],
          },
        },
      },
    },
  });
  await waitFor(() => stamps.get(name)?.done !== undefined, 120_000);
  const total = stamps.get(name)!.done! - t0;
  await batch.deleteNamespacedJob({ name, namespace: RUNS_NS, propagationPolicy: 'Background' });
  return { total, s: stamps.get(name)!, t0 };
}

/** Runs the bench and prints a Markdown report through `say`. */
export async function benchCluster(opts: ClusterBenchOptions): Promise<void> {
  const say = opts.say;
  say('## 6. A real cluster: sandpod cold runs against the bare Job floor');
  const kubeconfig = process.env.SANDPOD_BENCH_KUBECONFIG ?? process.env.SANDPOD_E2E_KUBECONFIG;
  const image = process.env.SANDPOD_BENCH_IMAGE ?? process.env.SANDPOD_E2E_IMAGE;
  if (!kubeconfig || !image) {
    say('Skipped: set SANDPOD_BENCH_KUBECONFIG (a kubeconfig) and SANDPOD_BENCH_IMAGE (the executor image the node runs) to measure on a cluster.');
    say('');
    return;
  }
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfig);
  await applyObjects(kc, manifests());
  // The warm scenario's own JobType: `default`'s limits, a pool of 2 (spec.warmPool.size). Applied
  // again before the warm runs: on a shared cluster an older CRD applied meanwhile prunes warmPool.
  // The data type only for the warm phase: its pool pods (importing pandas under gVisor) would load
  // the machine while the cold runs are measured.
  const applyWarmType = (withData = false) =>
    applyObjects(kc, [
      ...manifests().filter((o) => o.kind === 'CustomResourceDefinition'),
      { apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType', metadata: { name: 'bench-warm', namespace: NS }, spec: { memoryLimit: '256m', cpuLimit: 0.5, timeout: 30, warmPool: { size: 2 } } } as KubernetesObject,
      ...(DATA_IMAGE && withData
        ? [{ apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType', metadata: { name: 'bench-data', namespace: NS }, spec: { image: DATA_IMAGE, preload: ['numpy', 'pandas'], memoryLimit: '512m', cpuLimit: 1, timeout: 60, warmPool: { size: 2 } } } as KubernetesObject]
        : []),
    ]);
  await applyWarmType();
  // A data type left by an earlier run would keep its pool pods importing pandas through the cold runs.
  await kc.makeApiClient(CustomObjectsApi).deleteNamespacedCustomObject({ group: 'sandpod.io', version: 'v1alpha1', namespace: NS, plural: 'jobtypes', name: 'bench-data' }).catch(() => undefined);
  const batch = kc.makeApiClient(BatchV1Api);
  const { stamps, stop } = await stampPods(kc);
  const runs = Math.max(3, opts.runs);
  const db = await freshDatabase();
  const prevKubeconfig = process.env.KUBECONFIG;
  process.env.KUBECONFIG = kubeconfig;
  const instance = `bench-${randomUUID().slice(0, 6)}`;
  // No pool for other types (spec.warmPool.size of bench-warm only).
  const config = (warmPoolSize: number) => parseConfig(
    {
      log_level: 'silent',
      workspace: db.workspace,
      ...(db.url ? { database_url: db.url } : {}),
      runtime: 'kubernetes',
      security_mode: GVISOR ? 'strict' : 'permissive',
      max_workers: 2,
      kubernetes: { namespace: NS, runs_namespace: RUNS_NS, instance, runtime_class: RUNTIME_CLASS ?? 'no-such-runtime-class', executor_image: image, preflight: false, warm_pool_size: warmPoolSize, cold_start: process.env.SANDPOD_BENCH_COLD_START === 'secret' ? 'secret' : 'attach' },
    },
    {},
  );
  let svc = await createService(config(0), { logger: silentLogger });
  let svcStopped = false;
  try {
    await svc.start();
    const server = await listen(svc, 0, '127.0.0.1');
    const addr = server.address();
    const url = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}/execute`;
    // One of each first: the image is on the node, the informers are synced.
    await bareJob(batch, image, stamps);
    await postJson(url, { code: 'print(1)' });
    const floor: number[] = [];
    const floorStages: PodStamps[] = [];
    const withTmp: number[] = [];
    const cold: number[] = [];
    const coldStages: { t0: number; end: number; s: PodStamps; timing: Record<string, number> }[] = [];
    for (let i = 0; i < runs; i++) {
      const f = await bareJob(batch, image, stamps);
      floor.push(f.total);
      floorStages.push(rel(f.s, f.t0));
      withTmp.push((await bareJob(batch, image, stamps, true)).total);
      const t0 = performance.now();
      const body = (await postJson(url, { code: 'print(1)' })).body as { execution_id?: string; stdout?: string; timing?: Record<string, number> };
      const end = performance.now();
      if (body.stdout !== '1\n') throw new Error(`unexpected response: ${JSON.stringify(body)}`);
      cold.push(end - t0);
      const st = stamps.get(jobNameFor(body.execution_id ?? ''));
      coldStages.push({ t0, end, s: st ? rel(st, t0) : {}, timing: body.timing ?? {} });
    }
    const f50 = quantile(floor, 0.5);
    const c50 = quantile(cold, 0.5);
    say(`${runs} runs each, sequential, interleaved, after one warm-up of each. JobType \`default\` (0.5 CPU, 256 MiB), ${GVISOR ? 'gVisor (RuntimeClass gvisor) for floor and sandpod alike' : 'runc (no gVisor RuntimeClass)'}.`);
    say('');
    say('| measure | floor (bare Job) | sandpod cold | ratio p50 | target | verdict |');
    say('|---|---|---|---|---|---|');
    say(`| p50 | ${ms(f50)} ms | ${ms(c50)} ms | ${(c50 / f50).toFixed(2)}× | ≤ ${COLD_TARGET_RATIO} × floor = ${ms(COLD_TARGET_RATIO * f50)} ms | ${c50 <= COLD_TARGET_RATIO * f50 ? 'met' : 'MISSED'} |`);
    say(`| p95 | ${ms(quantile(floor, 0.95))} ms | ${ms(quantile(cold, 0.95))} ms | | | |`);
    say('');
    const t50 = quantile(withTmp, 0.5);
    say(`For reference (not the target's floor): the same bare Job with one emptyDir mounted at /tmp, interleaved with the two above: p50 ${ms(t50)} ms (${ms(t50 - f50)} ms over the bare floor), p95 ${ms(quantile(withTmp, 0.95))} ms; sandpod cold p50 is ${(c50 / t50).toFixed(2)}× it. A pod with any volume waits for the kubelet's volume check (at once, then every 300 ms) before its sandbox starts; every sandpod pod has volumes (read-only /code and /input, writable /output and /tmp).`);
    say('');
    say('Where the time goes (p50 of each stage, ms from the create call / the POST; watch receive times):');
    say('');
    say('| stage | floor | sandpod |');
    say('|---|---|---|');
    const stage = (xs: (number | undefined)[]) => {
      const v = xs.filter((x): x is number => x !== undefined);
      return v.length ? ms(quantile(v, 0.5)) : '–';
    };
    for (const k of ['created', 'scheduled', 'running', 'mainEnded', 'done', 'deleted'] as const) {
      say(`| pod ${k} | ${stage(floorStages.map((s) => s[k]))} | ${stage(coldStages.map((c) => c.s[k]))} |`);
    }
    say(`| HTTP answer | – | ${ms(c50)} |`);
    say('');
    await new Promise<void>((r) => server.close(() => r()));
    await svc.stop(5000);

    // Warm: a service of the same instance keeping 2 pool pods of `bench-warm` (and of `bench-data`).
    await applyWarmType(true);
    svc = await createService(config(0), { logger: silentLogger });
    await svc.start();
    const wserver = await listen(svc, 0, '127.0.0.1');
    const waddr = wserver.address();
    const base = `http://127.0.0.1:${typeof waddr === 'object' && waddr ? waddr.port : 0}`;
    type Warm = { job_type: string; ready: number; hits: number; misses: number };
    const warmStats = async (jt: string) => ((await getJson(`${base}/pool/stats`)).body as { warm?: Warm[] }).warm?.find((w) => w.job_type === jt);
    const waitReady = async (jt: string, n: number, ms = 180_000) => {
      const end = performance.now() + ms;
      while (((await warmStats(jt))?.ready ?? 0) < n && performance.now() < end) await new Promise((r) => setTimeout(r, 100));
    };
    /**
     * `runs` sequential warm runs of `code` on `jt`'s pool, twice: settled (each run waits for the pool
     * to be full again, then a second: the target's measure, a hit on a node not booting a refill) and
     * back to back (500 ms apart: the claimed pod's refill boots beside the next run on this node's
     * two cores).
     */
    const warmRuns = async (jt: string, code: string, want: string, target: number, what: string) => {
      await waitReady(jt, 2);
      if (((await warmStats(jt))?.ready ?? 0) === 0) {
        say(`${what}: skipped, no pool pod of \`${jt}\` became ready within 3 min (is its \`spec.warmPool\` still there? an older CRD prunes it).`);
        say('');
        throw new Error('warm pool never became ready');
      }
      const post = async () => {
        const t0 = performance.now();
        const body = (await postJson(`${base}/execute`, { code, job_type: jt })).body as { stdout?: string; timing?: Record<string, number> };
        if (body.stdout !== want) throw new Error(`unexpected response: ${JSON.stringify(body)}`);
        return { ms: performance.now() - t0, startup: body.timing?.startup_ms };
      };
      await post(); // warm-up
      const series = async (settled: boolean) => {
        const warm: number[] = [];
        const startup: number[] = [];
        const before = await warmStats(jt);
        for (let i = 0; i < runs; i++) {
          if (settled) {
            await waitReady(jt, 2, 60_000);
            await new Promise((res) => setTimeout(res, 1000));
          } else await waitReady(jt, 1, 30_000);
          const r = await post();
          warm.push(r.ms);
          if (r.startup !== undefined) startup.push(r.startup);
          if (!settled) await new Promise((res) => setTimeout(res, 500));
        }
        const after = await warmStats(jt);
        return { warm, startup, hits: (after?.hits ?? 0) - (before?.hits ?? 0), misses: (after?.misses ?? 0) - (before?.misses ?? 0) };
      };
      const settled = await series(true);
      const b2b = await series(false);
      const w50 = quantile(settled.warm, 0.5);
      say(`${what}: ${runs} sequential runs each way, pool of 2 for \`${jt}\`. Settled: each run once the pool is full again (+1 s), hits ${settled.hits}, misses ${settled.misses}. Back to back: 500 ms apart, the claimed pod's refill booting beside the next run, hits ${b2b.hits}, misses ${b2b.misses}.`);
      say('');
      say('| measure | settled | back to back | target (settled) | verdict |');
      say('|---|---|---|---|---|');
      say(`| p50 | ${ms(w50)} ms | ${ms(quantile(b2b.warm, 0.5))} ms | ≤ ${target} ms | ${w50 <= target ? 'met' : 'MISSED'} |`);
      say(`| p95 | ${ms(quantile(settled.warm, 0.95))} ms | ${ms(quantile(b2b.warm, 0.95))} ms | | |`);
      if (settled.startup.length) say(`| startup_ms p50 | ${ms(quantile(settled.startup, 0.5))} ms | ${b2b.startup.length ? ms(quantile(b2b.startup, 0.5)) : '–'} ms | near 0 | |`);
      say('');
    };
    // Both pools full first: data pool pods still importing pandas would share the cores with the print(1) runs.
    if (DATA_IMAGE) await waitReady('bench-data', 2);
    await warmRuns('bench-warm', 'print(1)', '1\n', WARM_TARGET_MS, 'Warm');
    if (DATA_IMAGE) await warmRuns('bench-data', DATA_CODE, '3\n', DATA_WARM_TARGET_MS, 'Warm `data` (pandas preloaded)');
    else say('Warm `data`: skipped, set SANDPOD_BENCH_DATA_IMAGE (an executor image with python3-numpy and python3-pandas).\n');
    await new Promise<void>((r) => wserver.close(() => r()));
    await svc.stop(5000);
    svcStopped = true;
    // The pool outlives the service (a restart would adopt it): this instance is gone for good.
    await batch.deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance}`, propagationPolicy: 'Background' }).catch(() => undefined);
  } finally {
    stop();
    if (!svcStopped) await svc.stop(5000);
    await db.drop();
    if (prevKubeconfig === undefined) delete process.env.KUBECONFIG;
    else process.env.KUBECONFIG = prevKubeconfig;
  }
}

function rel(s: PodStamps, t0: number): PodStamps {
  const out: PodStamps = {};
  for (const [k, v] of Object.entries(s) as [keyof PodStamps, number][]) out[k] = v - t0;
  return out;
}
