/**
 * `make bench` section `work`, second part (issue 18 item 3): the sustained rate of the `data` type
 * (numpy and pandas preloaded) on the local runtime: the highest open-loop arrival rate at which at
 * least 90 % of runs find a warm sandbox, with a pool that refills by booting and, on gVisor, one
 * that refills by restoring a checkpoint (`warm_pool.restore`). Target: restore ≥ 3 × boot.
 *
 * Method: a pool of 2 (`max_starting` 2), filled before each step; a step sends BENCH_SUSTAINED_RUNS
 * (default 12) runs at a fixed rate without waiting for answers; rates start at 0.2/s and grow by
 * 1.5× until a step falls below 90 % hits (or 8/s), then two bisection steps between the last rate
 * held and the first missed narrow the answer to ~10 %. A miss runs cold, as in production.
 */
import { mkdtempSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseConfig, type Config } from '../src/config.ts';
import { FileJobTypeRegistry } from '../src/jobtypes/job-type.ts';
import { createLocalRuntime, type EngineName, type LocalRuntime } from '../src/runtime/local/index.ts';

const CODE = 'import pandas as pd\nprint(pd.DataFrame({"a": [1, 2]}).a.sum())\n';
const POOL = 2;
/** Bisection steps after the ×1.5 bracket (BENCH_SUSTAINED_BISECT). */
const BISECT = Number(process.env.BENCH_SUSTAINED_BISECT ?? 2);
const sleep = (t: number) => new Promise((r) => setTimeout(r, t));

/** One step: `n` arrivals at `rate`/s once the pool is full; the share of hits. */
async function hitShare(rt: LocalRuntime, config: Config, rate: number, n: number): Promise<number> {
  const stat = () => rt.warmPoolStats().find((s) => s.job_type === 'data');
  for (let w = 0; w < 2400 && (stat()?.ready ?? 0) < POOL; w++) await sleep(50);
  const before = stat()?.hits ?? 0;
  const jobType = new FileJobTypeRegistry(config).get('data')!;
  const runs: Promise<unknown>[] = [];
  for (let i = 0; i < n; i++) {
    runs.push(
      rt
        .run({ executionId: `s-${i}-${Date.now()}`, code: CODE, inputJson: '{}', jobType, timeoutSec: 120, startupTimeoutSec: 300, requirements: [], maxStdoutBytes: 32768, maxArtifactBytes: 1 << 20 })
        .then((r) => {
          if (r.stdout !== '3\n') throw new Error(`unexpected output ${JSON.stringify(r.stdout)} ${r.stderr.slice(-300)}`);
        }),
    );
    await sleep(1000 / rate);
  }
  await Promise.all(runs);
  return ((stat()?.hits ?? 0) - before) / n;
}

/** The highest rate (per second) held at ≥ 90 % hits, and the pool's mean refill time. */
async function sustained(engine: EngineName, restore: boolean, n: number): Promise<{ rate: number; refillMs: number | null; steps: string[] }> {
  const w = mkdtempSync(path.join(tmpdir(), 'sandpod-bench-sustained-'));
  chmodSync(w, 0o755);
  const config = parseConfig(
    {
      workspace: w,
      sandbox_engine: engine,
      log_level: 'silent',
      max_workers: 8,
      warm_pool: { sizes: { data: POOL }, restore, max_idle_sec: 900, max_starting: 2 },
      job_types: [{ name: 'data', preload: ['numpy', 'pandas'], memory_limit: '1g', timeout: 120 }],
    },
    {},
  );
  const rt = createLocalRuntime(config);
  await rt.start();
  const steps: string[] = [];
  const step = async (rate: number): Promise<boolean> => {
    const share = await hitShare(rt, config, rate, n);
    steps.push(`${rate.toFixed(2)}/s: ${Math.round(share * 100)} %`);
    return share >= 0.9;
  };
  try {
    // Bracket: rates ×1.5 from 0.2/s until one falls below 90 % hits; then halve the bracket
    // (geometric midpoints) BISECT times, so the held rate is known within ~1.5^(1/2^BISECT) and the
    // two pools are compared at the same precision, not at the bracket's coarse steps.
    let held = 0;
    let failed = 0;
    for (let rate = 0.2; rate <= 8; rate *= 1.5) {
      if (!(await step(rate))) {
        failed = rate;
        break;
      }
      held = rate;
    }
    for (let i = 0; i < BISECT && held > 0 && failed > 0; i++) {
      const mid = Math.sqrt(held * failed);
      if (await step(mid)) held = mid;
      else failed = mid;
    }
    return { rate: held, refillMs: rt.warmPoolStats().find((s) => s.job_type === 'data')?.refill_ms ?? null, steps };
  } finally {
    await rt.stop();
  }
}

/** The part's table; `say` writes a report line. */
export async function benchSustained(o: { engines: EngineName[]; say: (s?: string) => void }): Promise<void> {
  const { say } = o;
  const n = Number(process.env.BENCH_SUSTAINED_RUNS ?? 12);
  say(`### Sustained rate of the data type: highest arrival rate with ≥ 90 % hits (pool ${POOL}, ${n} runs per step, rates ×1.5 from 0.2/s, then ${BISECT} bisection steps). Target: restore ≥ 3 × boot.`);
  say('');
  say('| engine | refill | mean refill ms | sustained rate | steps | restore / boot | verdict |');
  say('|---|---|---|---|---|---|---|');
  for (const engine of o.engines) {
    const boot = await sustained(engine, false, n);
    say(`| ${engine} | boot | ${boot.refillMs ?? '–'} | ${boot.rate.toFixed(2)}/s | ${boot.steps.join('; ')} | | |`);
    if (engine !== 'gvisor') continue; // checkpoint/restore is gVisor's
    const restored = await sustained(engine, true, n);
    const ratio = boot.rate > 0 ? restored.rate / boot.rate : Infinity;
    say(`| ${engine} | restore | ${restored.refillMs ?? '–'} | ${restored.rate.toFixed(2)}/s | ${restored.steps.join('; ')} | ${ratio.toFixed(1)}× | ${ratio >= 3 ? 'met' : 'NOT met'} |`);
  }
  say('');
}
