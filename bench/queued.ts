/**
 * 5,000 queued async jobs drain at the worker limit, and the history stays fast meanwhile (issue 20
 * item 4), on PostgreSQL; plus the database's load per run for the capacity model (docs/capacity.md).
 *
 * The runs themselves are a stand-in runtime that answers each run after RUN_MS (no sandbox), so
 * the drain measures the queue (claims, finalization, the record writes), not an engine: the
 * machine's two cores would otherwise spend the drain in Python start-ups.
 * 1. An API-only process (dispatch off) takes the jobs through POST /execute/async.
 * 2. A second process with the dispatcher (max_workers as configured) drains them while a client
 *    asks GET /executions?limit=100 every POLL_MS; its latency p50/p99 over the drain is reported,
 *    with the process's event-loop delay p99 meanwhile (the list answers in the loop the drain
 *    shares: when the two p99s are alike, the tail is the loop's, not the query's), and the same
 *    request's p50/p99 over BASELINE_POLLS before the drain starts (what the machine gives an idle
 *    process: the floor under the drain's figure).
 * Checked: every job succeeded and ran exactly once; runs in progress never above max_workers.
 * 3. PostgreSQL load per run: statements sent by the service's pool (every pg.Client query counted),
 *    rows they returned or changed, and the database's growth in bytes, over PER_RUN_JOBS submitted
 *    and drained with no history client.
 */
import { loadavg } from 'node:os';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import pg from 'pg';
import { parseConfig, type Config } from '../src/config.ts';
import { silentLogger } from '../src/logger.ts';
import { createService } from '../src/main.ts';
import type { RawRun, Runtime, RunSpec } from '../src/runtime/runtime.ts';
import { freshDatabase, type TestDatabase } from '../test/support/db.ts';
import { ms, quantile } from './stats.ts';

const RUN_MS = 20;
const POLL_MS = 20;
const PER_RUN_JOBS = 200;
const BASELINE_POLLS = 300;

/** A runtime that runs nothing: each run answers `ok` after RUN_MS; counts runs and concurrency. */
function standIn(real: Runtime): { runtime: Runtime; runs: Map<string, number>; peak: () => number } {
  const runs = new Map<string, number>();
  let active = 0;
  let peak = 0;
  const runtime: Runtime = {
    name: real.name,
    start: () => real.start(),
    stop: () => real.stop(),
    health: () => real.health(),
    async run(spec: RunSpec, opts = {}): Promise<RawRun> {
      runs.set(spec.executionId, (runs.get(spec.executionId) ?? 0) + 1);
      peak = Math.max(peak, ++active);
      const startedAt = new Date();
      try {
        opts.onPhase?.('execution');
        await new Promise((r) => setTimeout(r, RUN_MS));
      } finally {
        active--;
      }
      const endedAt = new Date();
      return {
        observation: {
          exitCode: 0, timedOut: null, oomKilled: false, cancelled: false, dependencyError: null, infraError: null, phase: 'completed',
          startedAt, endedAt, startupMs: 0, depInstallMs: 0, executionMs: RUN_MS, totalMs: endedAt.getTime() - startedAt.getTime(),
        },
        report: { phase: 'completed', exit_code: 0, execution_ms: RUN_MS },
        stdout: 'ok\n', stderr: '', stdoutTruncated: false, stderrTruncated: false, resultJson: '{"ok": true}', artifacts: [],
      };
    },
  };
  return { runtime, runs, peak: () => peak };
}

function config(db: TestDatabase, extra: Record<string, unknown>): Config {
  return parseConfig({ log_level: 'silent', workspace: db.workspace, ...(db.url ? { database_url: db.url } : {}), sandbox_engine: 'process', max_queue_size: 1_000_000, warm_pool: { sizes: {} }, ...extra }, {});
}

async function submit(app: { request: (p: string, i: RequestInit) => Response | Promise<Response> }, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let done = 0; done < n; done += 100) {
    const batch = await Promise.all(
      Array.from({ length: Math.min(100, n - done) }, async (_, i) => {
        const r = await app.request('/execute/async', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ code: `print(${done + i})` }) });
        if (r.status !== 202) throw new Error(`submission answered ${r.status}: ${await r.text()}`);
        return ((await r.json()) as { job_id: string }).job_id;
      }),
    );
    ids.push(...batch);
  }
  return ids;
}

async function statusCounts(url: string): Promise<Record<string, number>> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const r = await c.query<{ status: string; n: string }>('SELECT status, count(*) AS n FROM executions GROUP BY status');
  await c.end();
  return Object.fromEntries(r.rows.map((x) => [x.status, Number(x.n)]));
}

/** Runs the section; prints Markdown through `say`. */
export async function benchQueued(opts: { jobs: number; say: (s: string) => void }): Promise<void> {
  const { say } = opts;
  const db = await freshDatabase();
  if (!db.url) {
    say('not measured: PostgreSQL is not reachable (this section is about PostgreSQL)');
    return;
  }
  try {
    const load0 = loadavg();
    const api = await createService(config(db, { dispatch: false }), { logger: silentLogger });
    await api.start();
    const t0 = performance.now();
    const ids = await submit(api.app, opts.jobs);
    const submitSec = (performance.now() - t0) / 1000;
    await api.stop(1000);

    let fake!: ReturnType<typeof standIn>;
    const cfg = config(db, {});
    const worker = await createService(cfg, {
      logger: silentLogger,
      runtime: async (real) => (fake = standIn(await real())).runtime,
    });
    const list = async () => {
      const s = performance.now();
      const r = await worker.app.request('/executions?limit=100');
      const body = (await r.json()) as { count?: number };
      if (r.status !== 200 || body.count !== 100) throw new Error(`GET /executions: ${r.status} ${JSON.stringify(body).slice(0, 200)}`);
      return performance.now() - s;
    };
    // The floor: the same request, same process and data, nothing draining yet.
    const idle: number[] = [];
    for (let i = 0; i < BASELINE_POLLS; i++) {
      idle.push(await list());
      await new Promise((res) => setTimeout(res, POLL_MS));
    }
    const lat: number[] = [];
    const loop = monitorEventLoopDelay({ resolution: 5 });
    loop.enable();
    let polling = true;
    const poller = (async () => {
      while (polling) {
        lat.push(await list());
        await new Promise((res) => setTimeout(res, POLL_MS));
      }
    })();
    const t1 = performance.now();
    await worker.start();
    for (;;) {
      const c = await statusCounts(db.url);
      if ((c.succeeded ?? 0) + (c.failed ?? 0) + (c.error ?? 0) + (c.timeout ?? 0) >= ids.length) break;
      if (performance.now() - t1 > 600_000) throw new Error(`drain incomplete after 10 min: ${JSON.stringify(c)}`);
      await new Promise((r) => setTimeout(r, 250));
    }
    const drainSec = (performance.now() - t1) / 1000;
    polling = false;
    await poller;
    const counts = await statusCounts(db.url);
    const twice = [...fake.runs.values()].filter((n) => n > 1).length;
    const never = ids.filter((id) => !fake.runs.has(id)).length;
    await worker.stop(5000);
    const p99 = quantile(lat, 0.99);
    loop.disable();
    const loopP99 = loop.percentile(99) / 1e6;
    say(`PostgreSQL 15 on this machine (2 cores, shared; load average ${load0.map((x) => x.toFixed(1)).join(' ')} at start). Runtime: a stand-in that answers each run after ${RUN_MS} ms (no sandbox: the drain is about the queue). max_workers = ${cfg.max_workers}.`);
    say('');
    say('| jobs | submitted in | drained in | jobs/s | peak runs at once | succeeded | run twice | never run | `GET /executions?limit=100` p50 | p99 | polls | event-loop delay p99 | target p99 | verdict |');
    say('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
    const ok = counts.succeeded === ids.length && twice === 0 && never === 0 && fake.peak() <= cfg.max_workers && p99 <= 50;
    say(`| ${ids.length} | ${submitSec.toFixed(1)} s | ${drainSec.toFixed(1)} s | ${(ids.length / drainSec).toFixed(0)} | ${fake.peak()} | ${counts.succeeded ?? 0} | ${twice} | ${never} | ${ms(quantile(lat, 0.5))} ms | ${ms(p99)} ms | ${lat.length} | ${ms(loopP99)} ms | ≤ 50 ms | ${ok ? 'met' : 'MISSED'} |`);
    say('');
    say(`The same request before the drain started (${idle.length} polls, nothing else in the process): p50 ${ms(quantile(idle, 0.5))} ms, p99 ${ms(quantile(idle, 0.99))} ms.`);
    say('');
    await perRunLoad(db, say);
    say(`Load average at end: ${loadavg().map((x) => x.toFixed(1)).join(' ')}.`);
  } finally {
    await db.drop();
  }
}

/** Statements, rows and bytes per run: counted at the pg client over PER_RUN_JOBS submitted and drained. */
async function perRunLoad(db: TestDatabase, say: (s: string) => void): Promise<void> {
  const size = async () => {
    const c = new pg.Client({ connectionString: db.url! });
    await c.connect();
    await c.query('VACUUM');
    const r = await c.query<{ n: string }>('SELECT pg_database_size(current_database()) AS n');
    await c.end();
    return Number(r.rows[0]!.n);
  };
  // Patched before the service connects: the pool's clients wrap their query method when they connect
  // (prepared.ts), so a later patch of the prototype would not see their statements.
  const proto = pg.Client.prototype as unknown as { query: (...a: unknown[]) => unknown };
  const original = proto.query;
  const counts = { idle: { statements: 0, rows: 0 }, submit: { statements: 0, rows: 0 }, run: { statements: 0, rows: 0 } };
  let phase: keyof typeof counts = 'idle';
  proto.query = function (this: unknown, ...a: unknown[]) {
    const p = counts[phase];
    p.statements++;
    const out = original.apply(this, a);
    if (out && typeof (out as Promise<unknown>).then === 'function') {
      void (out as Promise<{ rowCount?: number | null } | { rowCount?: number | null }[]>).then(
        (r) => {
          for (const x of Array.isArray(r) ? r : [r]) p.rows += x?.rowCount ?? 0;
        },
        () => undefined,
      );
    }
    return out;
  };
  let fake!: ReturnType<typeof standIn>;
  const svc = await createService(config(db, {}), { logger: silentLogger, runtime: async (real) => (fake = standIn(await real())).runtime });
  await svc.start();
  await new Promise((r) => setTimeout(r, 500));
  const before = await size();
  let after = before;
  try {
    // Idle dispatch polls and wake-ups during the measure are counted too: a replica sends them.
    phase = 'submit';
    const ids = await submit(svc.app, PER_RUN_JOBS);
    phase = 'run';
    for (const id of ids) {
      const r = await svc.app.request(`/jobs/${id}/result?wait=true&timeout=60`);
      if (((await r.json()) as { status: string }).status !== 'succeeded') throw new Error(`job ${id} did not succeed`);
    }
  } finally {
    proto.query = original;
  }
  await svc.stop(2000);
  after = await size();
  say(`PostgreSQL load per run (${PER_RUN_JOBS} async runs, stdout \`ok\`, a small result, no artifacts; ${fake.runs.size} runs; counted at the service's pg client, the bench's own result reads included in "run"):`);
  say('');
  say('| part | statements / run | rows returned or changed / run |');
  say('|---|---|---|');
  for (const [k, v] of Object.entries(counts)) if (k !== 'idle') say(`| ${k === 'submit' ? 'submission (POST /execute/async)' : 'claim, run, finalize, result read'} | ${(v.statements / PER_RUN_JOBS).toFixed(1)} | ${(v.rows / PER_RUN_JOBS).toFixed(1)} |`);
  say('');
  say(`Database growth: ${((after - before) / PER_RUN_JOBS / 1024).toFixed(1)} KB per run (pg_database_size after VACUUM, indexes included).`);
  say('');
}

const isMain = import.meta.url === `file://${process.argv[1]}`;
if (isMain) await benchQueued({ jobs: Number(process.env.BENCH_QUEUED_JOBS ?? 5000), say: (l) => console.log(l) });
