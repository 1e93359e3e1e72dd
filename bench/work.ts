/**
 * `make bench` section `work` (BENCH_ONLY=work; issue 18): warm sandboxes for real work on the local
 * runtime, per engine, against the cold start and the cold bare-engine floor measured in the same run.
 * Runs go straight to the runtime (no HTTP, no database), so the numbers are the sandbox's.
 *
 * - `data`: `import pandas as pd; print(pd.DataFrame({"a": [1, 2]}).a.sum())` with Debian's
 *   python3-pandas, a job type that preloads numpy and pandas: cold start vs warm hit (targets: hit p50
 *   ≤ 0.1 × cold p50, hit p99 ≤ 0.2 × cold p50).
 * - `reqs`: a job type with requirements (a local wheel; installed and cached by one cold run first):
 *   warm hit vs the bare floor (target: p50 ≤ 0.35 × floor p50).
 * - `egress`: a job type with `allowed_hosts`: warm hit vs the bare floor (target: p50 ≤ 0.35 × floor p50).
 * Each hit is sent once its pool is ready again, so no refill competes with it. Then the sustained
 * rate of the data type, refilled by booting and (gVisor) by restoring a checkpoint: bench/sustained.ts
 * (BENCH_SUSTAINED=0 skips it).
 */
import { mkdtempSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseConfig, type Config } from '../src/config.ts';
import { FileJobTypeRegistry } from '../src/jobtypes/job-type.ts';
import { createLocalRuntime, measureBareFloor, type EngineName, type LocalRuntime } from '../src/runtime/local/index.ts';
import type { RunSpec } from '../src/runtime/runtime.ts';
import { buildWheels } from '../test/support/wheel.ts';
import { benchSustained } from './sustained.ts';
import { ms, quantile } from './stats.ts';

const PANDAS_CODE = 'import pandas as pd\nprint(pd.DataFrame({"a": [1, 2]}).a.sum())\n';
const sleep = (t: number) => new Promise((r) => setTimeout(r, t));

function workspace(): string {
  const w = mkdtempSync(path.join(tmpdir(), 'sandpod-bench-work-'));
  chmodSync(w, 0o755);
  return w;
}

function spec(config: Config, name: string, code: string): RunSpec {
  const jobType = new FileJobTypeRegistry(config).get(name)!;
  return {
    executionId: `b-${Math.random().toString(36).slice(2)}`,
    code,
    inputJson: '{}',
    jobType,
    timeoutSec: 120,
    startupTimeoutSec: 300,
    requirements: [...jobType.requirements],
    maxStdoutBytes: 32768,
    maxArtifactBytes: 1024 * 1024,
  };
}

/** Wall time of one run, ms; throws when its output is not `want`. */
async function timed(rt: LocalRuntime, s: RunSpec, want: string): Promise<number> {
  const t0 = performance.now();
  const r = await rt.run(s);
  const t = performance.now() - t0;
  if (r.stdout !== want) throw new Error(`${s.jobType.name}: unexpected output ${JSON.stringify(r.stdout)} ${r.stderr.slice(-500)}`);
  return t;
}

/** `n` hits of `name`, each once the pool of that job type is ready again; the hit count is checked. */
async function hits(rt: LocalRuntime, config: Config, name: string, code: string, want: string, n: number): Promise<number[]> {
  const stat = () => rt.warmPoolStats().find((s) => s.job_type === name);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    for (let w = 0; w < 1200 && (stat()?.ready ?? 0) < 1; w++) await sleep(50);
    const before = stat()?.hits ?? 0;
    out.push(await timed(rt, spec(config, name, code), want));
    if ((stat()?.hits ?? 0) !== before + 1) throw new Error(`${name}: run ${i} was not a hit`);
  }
  return out;
}

/** The section; `say` writes a report line. */
export async function benchWork(o: { engines: EngineName[]; runs: number; say: (s?: string) => void }): Promise<void> {
  const { say } = o;
  const n = Math.max(5, Math.min(o.runs, 30));
  const cold = Math.max(3, Math.min(o.runs, 8));
  say('## Warm sandboxes for real work (issue 18): data (pandas preloaded), requirements, allowed_hosts');
  say(`Per engine: ${n} hits per job type (each once its pool is ready again), ${cold} cold data runs, ${n} bare floor runs; wall time of runtime.run. Targets: data hit p50 ≤ 0.1 × cold p50 and p99 ≤ 0.2 × cold p50; reqs and egress hit p50 ≤ 0.35 × floor p50.`);
  say('');
  say('| engine | floor p50 | data cold p50 | data hit p50 / p99 | data p50, p99 / cold p50 | reqs hit p50 (/ floor) | egress hit p50 (/ floor) | refill ms (data) | verdict |');
  say('|---|---|---|---|---|---|---|---|---|');
  const wheels = buildWheels([{ name: 'sandpod-benchpkg', version: '1.0.0' }]);
  for (const engine of o.engines) {
    const base = {
      sandbox_engine: engine,
      log_level: 'silent',
      pip: { no_index: true, find_links: [wheels] },
      job_types: [
        { name: 'data', preload: ['numpy', 'pandas'], memory_limit: '1g', cpu_limit: 2, timeout: 120 },
        { name: 'reqs', requirements: ['sandpod-benchpkg'] },
        { name: 'egress', network: { mode: 'bridge', allowed_hosts: ['127.0.0.1:9'] } },
      ],
    };
    const coldCfg = parseConfig({ ...base, workspace: workspace(), warm_pool: { sizes: {} } }, {});
    const floor = await measureBareFloor(coldCfg, { engine, iterations: n });
    const coldRt = createLocalRuntime(coldCfg);
    await coldRt.start();
    const coldData: number[] = [];
    try {
      for (let i = 0; i < cold; i++) coldData.push(await timed(coldRt, spec(coldCfg, 'data', PANDAS_CODE), '3\n'));
    } finally {
      await coldRt.stop();
    }
    const warmCfg = parseConfig({ ...base, workspace: workspace(), warm_pool: { sizes: { data: 1, reqs: 1, egress: 1 }, max_idle_sec: 900 } }, {});
    const rt = createLocalRuntime(warmCfg);
    await rt.start();
    try {
      // The requirements' first run installs and caches them (cold); the pool then keeps them warm.
      await timed(rt, spec(warmCfg, 'reqs', 'import sandpod_benchpkg\n'), '');
      const data = await hits(rt, warmCfg, 'data', PANDAS_CODE, '3\n', n);
      const reqs = await hits(rt, warmCfg, 'reqs', 'import sandpod_benchpkg\nprint(1)\n', '1\n', n);
      const egress = await hits(rt, warmCfg, 'egress', 'print(1)\n', '1\n', n);
      const refill = rt.warmPoolStats().find((s) => s.job_type === 'data')?.refill_ms ?? null;
      const f = quantile(floor, 0.5);
      const c = quantile(coldData, 0.5);
      const [d50, d99, r50, e50] = [quantile(data, 0.5), quantile(data, 0.99), quantile(reqs, 0.5), quantile(egress, 0.5)];
      const ok = d50 <= 0.1 * c && d99 <= 0.2 * c && r50 <= 0.35 * f && e50 <= 0.35 * f;
      say(
        `| ${engine} | ${ms(f)} | ${ms(c)} | ${ms(d50)} / ${ms(d99)} | ${(d50 / c).toFixed(3)}, ${(d99 / c).toFixed(3)} | ${ms(r50)} (${(r50 / f).toFixed(2)}) | ${ms(e50)} (${(e50 / f).toFixed(2)}) | ${refill ?? '–'} | ${ok ? 'met' : 'NOT met'} |`,
      );
    } finally {
      await rt.stop();
    }
  }
  say('');
  if (process.env.BENCH_SUSTAINED !== '0') await benchSustained({ engines: o.engines, say });
}
