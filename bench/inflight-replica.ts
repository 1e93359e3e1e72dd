/**
 * The replica of the in-flight bench (bench/inflight.ts), in its own process so its RSS, heap and
 * event-loop delay are the controller's alone (the fake API server and the driver live in the parent).
 * Driven over IPC: `{ op: 'level', n }` starts n runs at once and reports each one's `execution`
 * phase and resolution; `{ op: 'sample' }` answers with memory figures; `{ op: 'stop' }` ends it.
 * Run with --expose-gc so the memory samples are taken after a full collection.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { writeHeapSnapshot } from 'node:v8';
import * as v from 'valibot';
import { KubeConfig } from '@kubernetes/client-node';
import { JobTypeConfigSchema, parseConfig } from '../src/config.ts';
import { fromConfig } from '../src/jobtypes/job-type.ts';
import { createKubernetesRuntime } from '../src/runtime/kubernetes/index.ts';
import type { RunSpec } from '../src/runtime/runtime.ts';

type Msg = { op: 'level'; n: number; tag: string } | { op: 'sample' } | { op: 'stop' };

const send = (m: object) => {
  if (process.connected) process.send!(m);
};
const gc = (globalThis as { gc?: () => void }).gc ?? (() => undefined);
const now = () => performance.timeOrigin + performance.now();

const server = process.argv[2]!;
const kc = new KubeConfig();
kc.loadFromOptions({
  clusters: [{ name: 'fake', server, skipTLSVerify: true }],
  users: [{ name: 'fake', token: 'fake-token' }],
  contexts: [{ name: 'fake', cluster: 'fake', user: 'fake' }],
  currentContext: 'fake',
});
const config = parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:bench', preflight: false } }, {});
// The real runner (about 50 KB) rides on every run's command line, as in production.
const rt = createKubernetesRuntime(config, { kubeConfig: kc });
type Cache = { list(): object[] };
const controller = () => (rt as unknown as { internals: { controller: { pods: Cache; jobs: Cache; inFlight: number } } }).internals.controller;
await rt.start();
const jobType = fromConfig(v.parse(JobTypeConfigSchema, { name: 'default' }));
const eld = monitorEventLoopDelay({ resolution: 10 });

function heapMb(): number {
  gc();
  return process.memoryUsage().heapUsed;
}

/** Heap bytes of a structured copy of what the informers cache: what one cached run costs. */
function informerBytes(): { bytes: number; objects: number } {
  const c = controller();
  const items = [...c.pods.list(), ...c.jobs.list()];
  const h0 = heapMb();
  const copy = structuredClone(items);
  const h1 = heapMb();
  if (copy.length !== items.length) throw new Error('copy lost objects');
  return { bytes: Math.max(0, h1 - h0), objects: items.length };
}

let left = 0;
/** The level's event-loop delays so far, as (delay ns, count) pairs, one part per stretch between samples. */
const segments: { values: [number, number][]; max: number }[] = [];
function keepSegment(): void {
  if (eld.count > 0) {
    const values: [number, number][] = [];
    let seen = 0;
    for (const [p, value] of [...eld.percentiles].sort((a, b) => a[0] - b[0])) {
      const c = Math.round((p / 100) * eld.count) - seen;
      if (c > 0) values.push([value, c]);
      seen += Math.max(0, c);
    }
    segments.push({ values, max: eld.max });
  }
  eld.reset();
}
function segmentsQuantile(q: number): number {
  const all = segments.flatMap((x) => x.values).sort((a, b) => a[0] - b[0]);
  const total = all.reduce((n, [, c]) => n + c, 0);
  let acc = 0;
  for (const [value, c] of all) if ((acc += c) >= q * total) return value;
  return all.at(-1)?.[0] ?? 0;
}
// BENCH_INFLIGHT_TRACE: the event loop's stalls over 20 ms, with when they happened (ms since the level began).
let trace: { timer: NodeJS.Timeout; t0: number; last: number; cpu: number; stalls: [number, number, number][] } | null = null;
const cpuMs = () => {
  const c = process.cpuUsage();
  return (c.user + c.system) / 1000;
};
function startTrace(): void {
  const t0 = performance.now();
  trace = {
    t0,
    last: t0,
    cpu: cpuMs(),
    stalls: [],
    timer: setInterval(() => {
      if (!trace) return;
      const t = performance.now();
      const c = cpuMs();
      if (t - trace.last > 25) trace.stalls.push([Math.round(trace.last - trace.t0), Math.round(t - trace.last - 5), Math.round(c - trace.cpu)]);
      trace.last = t;
      trace.cpu = c;
    }, 5),
  };
}
function stopTrace(n: number): void {
  if (!trace) return;
  clearInterval(trace.timer);
  const st = trace.stalls;
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  console.error(`[trace ${n}] ${st.length} stalls over 20 ms, ${sum(st.map((x) => x[1]))} ms in all, of which the process's own CPU ${sum(st.map((x) => x[2]))} ms (CPU of both threads: GC helpers count). Stalls (at ms: length/cpu ms): ${st.map(([a, l, c]) => `${a}:${l}/${c}`).join(' ')}`);
  trace = null;
}
process.on('message', (m: Msg) => {
  if (m.op === 'stop') {
    void rt.stop().then(() => process.exit(0));
    return;
  }
  if (m.op === 'sample') {
    // The full collections below are the bench's, not the controller's: kept out of the delay figure.
    const measuring = eld.count > 0 || left > 0;
    eld.disable();
    // A monitor re-enabled without a reset records the whole pause as one delay (it keeps its last
    // tick): this part of the level's figure is kept aside and the monitor starts afresh.
    if (measuring) keepSegment();
    const heap = heapMb();
    const inf = informerBytes();
    gc();
    if (process.env.BENCH_HEAP_SNAPSHOT && controller().inFlight >= 1000) console.error(`[trace] heap snapshot ${writeHeapSnapshot(`${process.env.BENCH_HEAP_SNAPSHOT}/held-${Date.now()}.heapsnapshot`)}`);
    send({ op: 'sample', rss: process.memoryUsage().rss, heap, informer: inf, inFlight: controller().inFlight });
    if (measuring && left > 0) eld.enable();
    return;
  }
  eld.reset();
  segments.length = 0;
  eld.enable();
  if (process.env.BENCH_INFLIGHT_TRACE) startTrace();
  const cpu0 = process.cpuUsage();
  left = m.n;
  const levelDone = () => {
    if (--left > 0) return;
    eld.disable();
    keepSegment();
    const cpu = process.cpuUsage(cpu0);
    stopTrace(m.n);
    send({ op: 'level-done', eldP99Ms: segmentsQuantile(0.99) / 1e6, eldMaxMs: Math.max(0, ...segments.map((x) => x.max)) / 1e6, cpuMs: (cpu.user + cpu.system) / 1000 });
  };
  for (let i = 0; i < m.n; i++) {
    const s: RunSpec = {
      executionId: `${m.tag}-${i.toString().padStart(5, '0')}`,
      code: 'print("hello")',
      inputJson: '{}',
      jobType,
      timeoutSec: 600,
      startupTimeoutSec: 600,
      requirements: [],
      maxStdoutBytes: 32768,
      maxArtifactBytes: 5 * 1024 * 1024,
    };
    rt.run(s, { onPhase: (p) => p === 'execution' && send({ op: 'execution', id: s.executionId }) }).then(
      (raw) => {
        const o = raw.observation;
        if (o.exitCode === 0) send({ op: 'resolved', id: s.executionId, at: now(), ok: true });
        else send({ op: 'failed', id: s.executionId, error: `exit ${o.exitCode}, ${o.infraError ? `${o.infraError.type}: ${o.infraError.message}` : o.timedOut ?? ''}` });
        levelDone();
      },
      (err: Error) => {
        send({ op: 'failed', id: s.executionId, error: err.message });
        levelDone();
      },
    );
  }
});
// The driver died: end too, rather than hold its runs forever.
process.on('disconnect', () => process.exit(1));
send({ op: 'ready' });
