/**
 * Controller overhead of the Kubernetes runtime against the in-repo fake API server:
 * - overhead per run: from the moment `main` is marked terminated in the fake to the moment `run()`
 *   resolves with the RawRun (watch event → reconcile → exec tar → parse → exec release → resolve);
 *   target p50 ≤ 50 ms;
 * - API calls per run (watches excluded, they are shared by all runs); target ≤ 8.
 * Runs are sequential so every request is attributable to one run.
 */
import * as v from 'valibot';
import { JobTypeConfigSchema, parseConfig } from '../src/config.ts';
import { fromConfig } from '../src/jobtypes/job-type.ts';
import { createKubernetesRuntime } from '../src/runtime/kubernetes/index.ts';
import { jobNameFor } from '../src/runtime/kubernetes/names.ts';
import type { RunSpec } from '../src/runtime/runtime.ts';
import { FakeKube } from '../test/support/fake-kube/server.ts';
import { outputTar } from '../test/support/fake-kube/tar.ts';

/** Options of {@link benchKubernetes}. */
export interface KubernetesBenchOptions {
  runs: number;
  say: (line: string) => void;
}

/** What the bench measured. */
export interface KubernetesBenchResult {
  overheadMs: { p50: number; p95: number; max: number };
  apiCallsPerRun: { mean: number; max: number };
  callsByKind: Record<string, number>;
}

function pct(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/** Runs the bench and prints a small Markdown report through `say` (the `make bench` entry). */
export async function benchKubernetes(opts: KubernetesBenchOptions): Promise<void> {
  await measureKubernetes(opts);
}

/** Runs the bench, prints the report through `say` and returns the numbers. */
export async function measureKubernetes(opts: KubernetesBenchOptions): Promise<KubernetesBenchResult> {
  const fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  const config = parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:bench', preflight: false } }, {});
  const rt = createKubernetesRuntime(config, { kubeConfig: fake.kubeConfig(), runnerSource: '# runner\n' });
  await rt.start();
  const jobType = fromConfig(v.parse(JobTypeConfigSchema, { name: 'default' }));
  const tar = await sampleOutputTar();
  const overheads: number[] = [];
  const calls: number[] = [];
  const byKind: Record<string, number> = {};
  const runs = Math.max(1, opts.runs);
  try {
    for (let i = 0; i < runs + 5; i++) {
      const warmup = i < 5;
      const s: RunSpec = {
        executionId: `bench-${i.toString().padStart(6, '0')}-${Date.now().toString(36)}`,
        code: 'print("hello")',
        inputJson: '{}',
        jobType,
        timeoutSec: 30,
        startupTimeoutSec: 60,
        requirements: [],
        maxStdoutBytes: 32768,
        maxArtifactBytes: 5 * 1024 * 1024,
      };
      const from = fake.requests.length;
      let inExecution!: () => void;
      const execution = new Promise<void>((r) => (inExecution = r));
      const running = rt.run(s, { onPhase: (p) => p === 'execution' && inExecution() });
      const pod = await fake.waitForPod(jobNameFor(s.executionId));
      fake.mainRunning(pod);
      await execution;
      fake.setOutput(pod, tar);
      fake.mainTerminated(pod, 0);
      await running;
      const resolvedAt = performance.now();
      if (warmup) continue;
      overheads.push(resolvedAt - fake.mainTerminatedAt.get(pod)!);
      const mine = fake.apiCalls(from);
      calls.push(mine.length);
      for (const r of mine) {
        const kind = `${r.method} ${r.path.replace(/\/namespaces\/[^/]+/, '/namespaces/*').replace(/\/(jobs|secrets|pods)\/[^/]+/, '/$1/*')}`;
        byKind[kind] = (byKind[kind] ?? 0) + 1;
      }
    }
  } finally {
    await rt.stop();
    await fake.close();
  }
  overheads.sort((a, b) => a - b);
  const result: KubernetesBenchResult = {
    overheadMs: { p50: pct(overheads, 50), p95: pct(overheads, 95), max: overheads[overheads.length - 1] ?? NaN },
    apiCallsPerRun: { mean: calls.reduce((a, b) => a + b, 0) / calls.length, max: Math.max(...calls) },
    callsByKind: Object.fromEntries(Object.entries(byKind).map(([k, n]) => [k, n / calls.length])),
  };
  const say = opts.say;
  say(`${runs} sequential runs; overhead = main terminated (in the fake) → RawRun resolved.`);
  say('');
  say('| measure | p50 | p95 | max | target | verdict |');
  say('|---|---|---|---|---|---|');
  say(
    `| controller overhead per run | ${result.overheadMs.p50.toFixed(1)} ms | ${result.overheadMs.p95.toFixed(1)} ms | ${result.overheadMs.max.toFixed(1)} ms | p50 ≤ 50 ms | ${result.overheadMs.p50 <= 50 ? 'met' : 'MISSED'} |`,
  );
  say(
    `| API calls per run | ${result.apiCallsPerRun.mean.toFixed(1)} (mean) | | ${result.apiCallsPerRun.max} | ≤ 8 | ${result.apiCallsPerRun.max <= 8 ? 'met' : 'MISSED'} |`,
  );
  say('');
  say('Calls per run by kind (watches are shared and not counted):');
  for (const [k, n] of Object.entries(result.callsByKind)) say(`- ${k}: ${n.toFixed(2)}`);
  return result;
}

const isMain = import.meta.url === `file://${process.argv[1]}`;
if (isMain) {
  const runs = Number(process.env.BENCH_RUNS ?? 100);
  await benchKubernetes({ runs, say: (l) => console.log(l) });
}

/** The `/output` of one benchmark run (100 lines of stdout, a result, a 4 KB file), as the collector streams it. */
export function sampleOutputTar(): Promise<Buffer> {
  return outputTar({
    phase: 'completed',
    stdout: 'hello\n'.repeat(100),
    stderr: '',
    report: { phase: 'completed', exit_code: 0, execution_ms: 5 },
    result: '{"ok": true}',
    files: { 'out.csv': 'a,b\n'.repeat(1000) },
  });
}
