/**
 * Runs held in flight at once by one replica, against the in-repo fake API server (issue 20 item 4).
 *
 * The replica (the Kubernetes runtime: informers, controller, API client) runs in its own process
 * (bench/inflight-replica.ts), so its RSS and event-loop delay are its own; this process holds the
 * fake API server and plays the kubelet. Per level (10, 100, 1,000 by default; BENCH_INFLIGHT):
 * the replica starts N runs at once; every pod's `main` is marked running; once all N are in their
 * execution phase they are held and the replica sampled (RSS, heap, informer memory, after a full
 * GC); then they finish one every FINISH_EVERY_MS (100 a second, while the rest stay in flight),
 * each with the same outputs as the `kubernetes` section.
 * - controller overhead = `main` terminated in the fake → the run's RawRun resolved in the replica
 *   (both clocks are performance.timeOrigin + now(), the same wall clock);
 * - event-loop delay = perf_hooks.monitorEventLoopDelay in the replica from the level's start to its
 *   last run resolved, the held sample's full collections left out (the monitor is reset around it:
 *   re-enabled without a reset it records the whole pause as one delay);
 * - API calls per run = non-watch requests of the level over N, the Lease's renewals and the runner
 *   sources ConfigMap's create left out (they are per replica, not per run; counted apart);
 * - informer memory = heap of a structured copy of the pod and Job caches, over the runs cached;
 * - replica CPU per run = its user + system CPU time over the level, over N (sizing: runs/s per core).
 * Targets: event-loop delay p99 ≤ 50 ms, overhead p99 ≤ 100 ms, API calls per run as the single run's,
 * RSS growth per in-flight run ≤ 200 KB. BENCH_CPU_PROF=dir writes a CPU profile of the replica there;
 * BENCH_HEAP_SNAPSHOT=dir a heap snapshot of it when 1,000 runs are held; BENCH_INFLIGHT_TRACE=1 prints
 * the replica's event-loop stalls over 20 ms (when, how long, how much of it the replica's own CPU)
 * and the overhead along the finishing order.
 *
 * The stand-in kubelet starts a pod's containers only once the Secret its volumes mount exists, as a
 * kubelet does (a pod without it stays ContainerCreating): otherwise runs reach their execution phase
 * while their Secret creates are still queued in the replica, and the held sample counts those.
 */
import { fork } from 'node:child_process';
import { loadavg } from 'node:os';
import { FakeKube } from '../test/support/fake-kube/server.ts';
import { sampleOutputTar } from './kubernetes.ts';
import { ms, quantile } from './stats.ts';

const FINISH_EVERY_MS = 10;

type Sample = { rss: number; heap: number; informer: { bytes: number; objects: number }; inFlight: number };
type Reply =
  | { op: 'ready' }
  | { op: 'execution'; id: string }
  | { op: 'resolved'; id: string; at: number; ok: boolean }
  | { op: 'failed'; id: string; error: string }
  | { op: 'level-done'; eldP99Ms: number; eldMaxMs: number; cpuMs: number }
  | ({ op: 'sample' } & Sample);

/** One level's figures. */
export interface InflightLevel {
  n: number;
  rss: number;
  rssPerRun: number;
  heap: number;
  informerPerRun: number;
  eldP99Ms: number;
  eldMaxMs: number;
  /** The replica's CPU time (user + system) over the level, per run, ms. */
  cpuMsPerRun: number;
  /** This process's (the fake API server's and the kubelet's) CPU time over the level, per run, ms. */
  fakeCpuMsPerRun: number;
  overheadP50: number;
  overheadP99: number;
  callsPerRun: number;
  leaseCalls: number;
  failed: number;
  seconds: number;
}

const now = () => performance.timeOrigin + performance.now();
const KB = (b: number) => (b / 1024).toFixed(0);
const MB = (b: number) => (b / 1024 / 1024).toFixed(0);

/** Runs the section; prints Markdown through `say` and returns the levels. */
export async function benchInflight(opts: { levels: number[]; say: (s: string) => void }): Promise<InflightLevel[]> {
  const { say } = opts;
  const fake = await FakeKube.start({ managedFields: true });
  fake.addRuntimeClass('gvisor');
  const child = fork('bench/inflight-replica.ts', [fake.url], { execArgv: ['--expose-gc', '--import', 'tsx', ...(process.env.BENCH_CPU_PROF ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_CPU_PROF] : [])], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const listeners = new Set<(m: Reply) => void>();
  child.on('message', (m: Reply) => {
    for (const l of [...listeners]) l(m);
  });
  const next = <T extends Reply['op']>(op: T, timeoutMs = 120_000) =>
    new Promise<Extract<Reply, { op: T }>>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`replica: no ${op} in ${timeoutMs} ms`)), timeoutMs);
      const l = (m: Reply) => {
        if (m.op !== op) return;
        clearTimeout(t);
        listeners.delete(l);
        resolve(m as Extract<Reply, { op: T }>);
      };
      listeners.add(l);
    });
  const tar = await sampleOutputTar();
  const sample = async () => {
    const p = next('sample');
    child.send({ op: 'sample' });
    return p;
  };

  const level = async (n: number, tag: string): Promise<Omit<InflightLevel, 'rssPerRun'> & { held: Sample }> => {
    const from = fake.requests.length;
    const t0 = performance.now();
    const cpu0 = process.cpuUsage();
    const executing = new Set<string>();
    const resolved = new Map<string, number>();
    const failures: string[] = [];
    const l = (m: Reply) => {
      if (m.op === 'execution') executing.add(m.id);
      else if (m.op === 'resolved') resolved.set(m.id, m.at);
      else if (m.op === 'failed') failures.push(`${m.id}: ${m.error}`);
    };
    listeners.add(l);
    const done = next('level-done', 600_000);
    child.send({ op: 'level', n, tag });
    // The kubelet: start `main` on every new pod of this level.
    const started = new Set<string>();
    const podsByExecution = new Map<string, string>();
    while (executing.size + failures.length < n) {
      // As a kubelet does, a pod's containers start only once the Secret its volumes mount exists
      // (the replica creates it after the Job); until then it is ContainerCreating.
      const secrets = new Set(fake.peek('secrets').map((x) => x.metadata.name));
      for (const p of fake.peek('pods')) {
        const id = p.metadata.labels?.['sandpod.io/execution-id'];
        if (!id?.startsWith(tag) || started.has(p.metadata.name)) continue;
        const mounts = ((p.spec as { volumes?: { secret?: { secretName?: string } }[] }).volumes ?? []).flatMap((vol) => (vol.secret?.secretName ? [vol.secret.secretName] : []));
        if (!mounts.every((name) => secrets.has(name))) continue;
        started.add(p.metadata.name);
        podsByExecution.set(id, p.metadata.name);
        fake.mainRunning(p.metadata.name);
      }
      if (performance.now() - t0 > 300_000) throw new Error(`only ${executing.size} of ${n} runs reached execution`);
      await new Promise((r) => setTimeout(r, 10));
    }
    const heldAt = performance.now();
    const held = await sample();
    const finishFrom = performance.now();
    const terminatedAt = new Map<string, number>();
    for (const [id, pod] of podsByExecution) {
      if (!fake.peek('pods').some((p) => p.metadata.name === pod)) continue; // gone: its run failed (reported below)
      fake.setOutput(pod, tar);
      fake.mainTerminated(pod, 0);
      terminatedAt.set(id, now());
      await new Promise((r) => setTimeout(r, FINISH_EVERY_MS));
    }
    const finishTo = performance.now();
    const end = await done;
    const cpu = process.cpuUsage(cpu0);
    // A run reports before its collector's release exec is answered (it goes in the background):
    // the calls are counted once the level's calls stop coming in (none for 150 ms).
    for (let seen = -1, quiet = 0; quiet < 3 && performance.now() - finishTo < 10_000; ) {
      const count = fake.apiCalls(from).length;
      quiet = count === seen ? quiet + 1 : 0;
      seen = count;
      await new Promise((r) => setTimeout(r, 50));
    }
    listeners.delete(l);
    if (failures.length) say(`${failures.length} runs of ${n} failed, e.g. ${failures.slice(0, 3).join('; ')}`);
    if (process.env.BENCH_INFLIGHT_TRACE) {
      const series = [...terminatedAt].map(([id, at]) => (resolved.get(id) ?? NaN) - at);
      const parts: string[] = [];
      for (let i = 0; i < series.length; i += Math.max(1, Math.floor(series.length / 20))) {
        const b = series.slice(i, i + Math.max(1, Math.floor(series.length / 20)));
        parts.push(`${i}:${Math.round(Math.max(...b))}`);
      }
      say(`[trace ${n}] overhead max per slice of finish order (index:ms): ${parts.join(' ')}`);
      say(`[trace ${n}] held at ${((heldAt - t0) / 1000).toFixed(1)} s, finishing from ${((finishFrom - t0) / 1000).toFixed(1)} s to ${((finishTo - t0) / 1000).toFixed(1)} s`);
    }
    const overheads = [...terminatedAt].map(([id, at]) => (resolved.get(id) ?? NaN) - at).filter((x) => Number.isFinite(x));
    const calls = fake.apiCalls(from);
    // Per replica, not per run: the Lease's renewals, and the runner sources ConfigMap's create (made
    // sure of before the first run's Job, then at most once a minute; runs/runner-sources.ts).
    const lease = calls.filter((c) => c.path.includes('/leases') || (c.method === 'POST' && c.path.endsWith('/configmaps'))).length;
    return {
      n,
      held,
      rss: held.rss,
      heap: held.heap,
      informerPerRun: held.informer.objects ? held.informer.bytes / n : 0,
      eldP99Ms: end.eldP99Ms,
      eldMaxMs: end.eldMaxMs,
      cpuMsPerRun: end.cpuMs / n,
      fakeCpuMsPerRun: (cpu.user + cpu.system) / 1000 / n,
      overheadP50: quantile(overheads, 0.5),
      overheadP99: quantile(overheads, 0.99),
      callsPerRun: (calls.length - lease) / n,
      leaseCalls: lease,
      failed: Math.max(failures.length, n - overheads.length),
      seconds: (performance.now() - t0) / 1000,
    };
  };

  const rows: InflightLevel[] = [];
  try {
    await next('ready', 60_000);
    // A single run first: the per-run figure the levels are held to; then a warm-up of 10.
    const single = await level(1, 'single');
    await level(10, 'warmup');
    const base = await sample();
    say(`Machine: ${process.env.BENCH_MACHINE ?? '2 cores'}; load average at start ${loadavg().map((x) => x.toFixed(1)).join(' ')}. Replica in its own process (RSS is its own); fake API server and kubelet in the bench process. Runs finish one every ${FINISH_EVERY_MS} ms while the rest stay in flight. Baseline after warm-up: RSS ${MB(base.rss)} MB, heap ${MB(base.heap)} MB. A single run: ${single.callsPerRun.toFixed(1)} API calls.`);
    say('');
    say('| in flight | RSS held | RSS growth / run | heap held | informer / cached run | event-loop delay p99 (max) | overhead p50 | overhead p99 | API calls / run | replica CPU / run | fake + kubelet CPU / run | lost | seconds |');
    say('|---|---|---|---|---|---|---|---|---|---|---|---|---|');
    for (const n of opts.levels) {
      const r = await level(n, `l${n}`);
      const row: InflightLevel = { ...r, rssPerRun: (r.rss - base.rss) / n };
      rows.push(row);
      say(
        `| ${n} | ${MB(row.rss)} MB | ${KB(row.rssPerRun)} KB | ${MB(row.heap)} MB | ${KB(row.informerPerRun)} KB | ${ms(row.eldP99Ms)} ms (${ms(row.eldMaxMs)}) | ${ms(row.overheadP50)} ms | ${ms(row.overheadP99)} ms | ${row.callsPerRun.toFixed(2)} | ${ms(row.cpuMsPerRun)} ms | ${ms(row.fakeCpuMsPerRun)} ms | ${row.failed} | ${row.seconds.toFixed(1)} |`,
      );
      await new Promise((r) => setTimeout(r, 500));
    }
    const top = rows[rows.length - 1]!;
    say('');
    const checks = [
      [`event-loop delay p99 ≤ 50 ms at ${top.n}`, top.eldP99Ms <= 50],
      [`controller overhead p99 ≤ 100 ms at ${top.n}`, top.overheadP99 <= 100],
      [`API calls per run = the single run's (${single.callsPerRun.toFixed(1)})`, rows.every((x) => Math.abs(x.callsPerRun - single.callsPerRun) < 0.05)],
      [`RSS growth per in-flight run ≤ 200 KB at ${top.n}`, top.rssPerRun <= 200 * 1024],
      ['no run lost', rows.every((x) => x.failed === 0)],
    ] as const;
    for (const [what, ok] of checks) say(`- ${what}: ${ok ? 'met' : 'MISSED'}`);
    say(`- load average at end: ${loadavg().map((x) => x.toFixed(1)).join(' ')}`);
  } finally {
    child.send({ op: 'stop' });
    await new Promise((r) => child.once('exit', r));
    await fake.close();
  }
  return rows;
}

const isMain = import.meta.url === `file://${process.argv[1]}`;
if (isMain) {
  const levels = (process.env.BENCH_INFLIGHT ?? '10,100,1000').split(',').map(Number);
  await benchInflight({ levels, say: (l) => console.log(l) });
}
