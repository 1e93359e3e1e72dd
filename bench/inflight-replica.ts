/**
 * The replica of the in-flight bench (bench/inflight.ts), in its own process so its RSS, heap and
 * event-loop delay are the controller's alone (the fake API server and the driver live in the parent).
 * Driven over IPC: `{ op: 'level', n }` starts n runs at once and reports each one's `execution`
 * phase and resolution; `{ op: 'sample' }` answers with memory figures; `{ op: 'stop' }` ends it.
 * Run with --expose-gc so the memory samples are taken after a full collection.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
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
process.on('message', (m: Msg) => {
  if (m.op === 'stop') {
    void rt.stop().then(() => process.exit(0));
    return;
  }
  if (m.op === 'sample') {
    // The full collections below are the bench's, not the controller's: kept out of the delay figure.
    const measuring = eld.count > 0 || left > 0;
    eld.disable();
    const heap = heapMb();
    const inf = informerBytes();
    gc();
    send({ op: 'sample', rss: process.memoryUsage().rss, heap, informer: inf, inFlight: controller().inFlight });
    if (measuring && left > 0) eld.enable();
    return;
  }
  eld.reset();
  eld.enable();
  const cpu0 = process.cpuUsage();
  left = m.n;
  const levelDone = () => {
    if (--left > 0) return;
    eld.disable();
    const cpu = process.cpuUsage(cpu0);
    send({ op: 'level-done', eldP99Ms: eld.percentile(99) / 1e6, eldMaxMs: eld.max / 1e6, cpuMs: (cpu.user + cpu.system) / 1000 });
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
