/**
 * `make bench`: measures sandpod against the bare floor measured in the same run, on this machine.
 *
 * 1. Sync `print(1)` latency through HTTP (real socket, keep-alive) including the database write,
 *    per sandbox engine, next to the engine invoked directly (issue 2: p50 ≤ 1.5 × floor + 5 ms).
 * 2. Async submissions accepted per second by one API process on PostgreSQL (issue 3: ≥ 3,000/s).
 * 3. Trivial jobs completed per minute with max_workers = 2 next to the bare engine's own loop with
 *    two parallel loops (issue 3: ≥ 60 %).
 * 4. The Kubernetes controller's overhead per run and API calls per run against the in-repo fake
 *    API server (issue 4: p50 ≤ 50 ms, ≤ 8 calls).
 * 5. History list latency at a million rows (issue 3: indexes keep it fast).
 * 6. On a real cluster (bench/cluster.ts; only with SANDPOD_BENCH_KUBECONFIG and SANDPOD_BENCH_IMAGE): cold
 *    runs through HTTP against the bare Job floor, and where the time goes.
 * 7. Local warm sandboxes (issue 10): sync `print(1)` on a warm hit, per engine, against the cold bare
 *    engine floor of the same run (p50 ≤ 0.35 × floor p50, p99 ≤ floor p50), and the hit ratio with
 *    4 concurrent clients at a rate the pool sustains (≥ 90 %). Section 1 runs with the pool off, so
 *    it stays the cold path's measurement.
 * 8. Runs in flight per replica against the fake API server (issue 20; bench/inflight.ts): 10, 100 and
 *    1,000 held at once, then finished; RSS, event-loop delay p99, API calls per run, informer memory
 *    and controller overhead p50/p99 (targets: delay p99 ≤ 50 ms, overhead p99 ≤ 100 ms, calls per run
 *    as a single run's, RSS growth ≤ 200 KB per run in flight). BENCH_INFLIGHT sets the levels.
 * 9. 5,000 queued async jobs drained at the worker limit on PostgreSQL with a stand-in runtime, nothing
 *    lost or run twice, GET /executions?limit=100 p99 ≤ 50 ms meanwhile; PostgreSQL statements, rows
 *    and bytes per run (issue 20; bench/queued.ts). BENCH_QUEUED_JOBS sets the count.
 * 10. Warm sandboxes for real work (issue 18; bench/work.ts, BENCH_ONLY=work): the data type (pandas
 *    preloaded) cold vs warm hit, requirements and allowed_hosts hits vs the bare floor, per engine.
 *
 * 11. Replicas (bench/replicas.ts; only with the e2e variables): time to first output through three API
 *     replicas on a real cluster, sequential, staggered and burst (issue 20: burst p50 ≤ 1.5 × sequential p50).
 *     BENCH_REPLICAS_POOL (warm pool, default 4) and BENCH_REPLICAS_WORKERS (max_workers, default 8).
 *
 * Env: BENCH_RUNS (default 200), BENCH_ENGINES (default: every usable one), BENCH_SECONDS (acceptance
 * load duration, default 5), BENCH_ONLY (comma list of sync,accept,throughput,kubernetes,history,cluster,warm,inflight,queued,work,replicas), BENCH_HISTORY_ROWS.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import { chmodSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseConfig, type Config } from '../src/config.ts';
import { silentLogger } from '../src/logger.ts';
import { createService, listen } from '../src/main.ts';
import { which } from '../src/runtime/local/engines.ts';
import { detectEngines, measureBareFloor, type EngineName } from '../src/runtime/local/index.ts';
import { freshDatabase, type TestDatabase } from '../test/support/db.ts';
import { seedHistory } from '../test/support/seed.ts';
import { closeConnections, getJson, postJson } from './http.ts';
import { ms, quantile } from './stats.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 200);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const WRK = which('wrk');
const ONLY = new Set((process.env.BENCH_ONLY ?? 'sync,accept,throughput,kubernetes,history,cluster,warm,inflight,queued,work,replicas').split(','));
const lines: string[] = [];
const say = (s = '') => {
  lines.push(s);
  console.log(s);
};

function workspace(): string {
  const w = mkdtempSync(path.join(tmpdir(), 'sandpod-bench-'));
  chmodSync(w, 0o755);
  return w;
}

function config(db: TestDatabase, extra: Record<string, unknown>): Config {
  return parseConfig({ log_level: 'silent', workspace: db.workspace, ...(db.url ? { database_url: db.url } : {}), ...extra }, {});
}


async function syncLatency(engines: EngineName[]): Promise<void> {
  say('## 1. Sync `print(1)` latency: HTTP + database write vs the bare engine');
  say(`${RUNS} runs each, sequential, after 20 warm-up runs. Target: service p50 ≤ 1.5 × floor p50 + 5 ms.`);
  say('');
  say('| engine | floor p50 | floor p99 | service p50 | service p99 | ratio p50 | target | verdict |');
  say('|---|---|---|---|---|---|---|');
  for (const engine of engines) {
    const db = await freshDatabase();
    // The cold path: no warm sandboxes (section 6 measures those).
    const cfg = config(db, { sandbox_engine: engine, max_workers: 2, warm_pool: { sizes: {} } });
    const svc = await createService(cfg, { logger: silentLogger });
    await svc.start();
    const server = await listen(svc, 0, '127.0.0.1');
    const addr = server.address();
    const url = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}/execute`;
    const floor: number[] = [];
    const service: number[] = [];
    // Warm both paths, then interleave blocks so drift on the machine hits both alike.
    await measureBareFloor(cfg, { engine, iterations: 20 });
    for (let i = 0; i < 20; i++) await postJson(url, { code: 'print(1)' });
    const block = 20;
    for (let done = 0; done < RUNS; done += block) {
      floor.push(...(await measureBareFloor(cfg, { engine, iterations: block })));
      for (let i = 0; i < block; i++) {
        const t0 = performance.now();
        const body = (await postJson(url, { code: 'print(1)' })).body as { stdout?: string };
        service.push(performance.now() - t0);
        if (body.stdout !== '1\n') throw new Error(`unexpected response: ${JSON.stringify(body)}`);
      }
    }
    const f50 = quantile(floor, 0.5);
    const s50 = quantile(service, 0.5);
    const target = 1.5 * f50 + 5;
    say(`| ${engine} | ${ms(f50)} ms | ${ms(quantile(floor, 0.99))} ms | ${ms(s50)} ms | ${ms(quantile(service, 0.99))} ms | ${(s50 / f50).toFixed(2)}× | ≤ ${ms(target)} ms | ${s50 <= target ? 'met' : 'MISSED'} |`);
    await new Promise<void>((r) => server.close(() => r()));
    await svc.stop(5000);
    await db.drop();
  }
  say('');
}

async function acceptance(): Promise<void> {
  say('## 2. Async submissions accepted per second (one API process, PostgreSQL)');
  const db = await freshDatabase();
  if (db.kind !== 'postgres') say('(PostgreSQL not reachable: measured on PGlite, which is not the target configuration)');
  // An API-only process (dispatch: false): the measurement is acceptance, not execution.
  const cfg = config(db, { dispatch: false, max_queue_size: 10_000_000, sandbox_engine: 'process' });
  const svc = await createService(cfg, { logger: silentLogger });
  await svc.start();
  const server = await listen(svc, 0, '127.0.0.1');
  const addr = server.address();
  const url = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}/execute/async`;
  const concurrency = 32;
  const load = await runLoad(url, concurrency);
  const rate = load.ok / load.seconds;
  await new Promise<void>((r) => server.close(() => r()));
  // Every 202 must stand for a row already committed: count them (warm-up included) against the table.
  const answered = load.ok + load.warmup_ok;
  const rows = Number((await svc.db.kysely.selectFrom('executions').select((eb) => eb.fn.countAll<string>().as('n')).executeTakeFirstOrThrow()).n);
  // The floor: a bare node:http server in this process that reads and parses the same body and
  // answers 202 with no validation, no database and no framework, under the same load.
  const bare = await bareHttpServer();
  const bareLoad = await runLoad(bare.url, concurrency);
  const bareRate = bareLoad.ok / bareLoad.seconds;
  await bare.close();
  say(`${concurrency} concurrent keep-alive connections from ${WRK ? 'wrk (one thread)' : 'bench/load.ts (Node; install wrk for a lighter load generator)'} in a separate process, ${SECONDS} s after 1 s warm-up; ${load.other} non-202 answers or socket errors.`);
  say('');
  say(`| bare node:http 202 | accepted/s | share | target | verdict |`);
  say('|---|---|---|---|---|');
  say(`| ${bareRate.toFixed(0)}/s | ${rate.toFixed(0)} | ${((rate / bareRate) * 100).toFixed(0)} % | ≥ 3000 | ${rate >= 3000 && rows >= answered ? 'met' : 'MISSED'} |`);
  say('');
  say(`Durability: ${rows} rows in \`executions\` after the run for ${answered} answers of 202 (warm-up included; a request still in flight when the load stopped may add a row it was never answered for) — ${rows >= answered ? 'every accepted job is stored' : `**${answered - rows} accepted jobs are missing**`}.`);
  say('');
  await svc.stop(1000);
  await db.drop();
}

/** `ok` and `other` count the measured seconds; `warmup_ok` the successful answers before them. */
type Load = { ok: number; other: number; seconds: number; warmup_ok: number };

/**
 * Drives `url` with `concurrency` keep-alive connections for SECONDS after a 1 s warm-up. wrk (C,
 * one thread) when installed — `make bench` installs it — so the load generator takes as little as
 * possible of the two cores the service and PostgreSQL share; else bench/load.ts (Node), which
 * costs the service a good part of a core. The report says which one ran.
 */
async function runLoad(url: string, concurrency: number): Promise<Load> {
  const run = (file: string, args: string[]) =>
    new Promise<string>((resolve, reject) => execFile(file, args, (err, stdout) => (err ? reject(err) : resolve(stdout))));
  if (!WRK) return JSON.parse(await run(process.execPath, ['--import', 'tsx', 'bench/load.ts', url, String(concurrency), String(SECONDS), '1'])) as Load;
  const wrk = async (seconds: number) => {
    const out = await run(WRK!, ['-t1', `-c${concurrency}`, `-d${seconds}s`, '-s', 'bench/post.lua', url]);
    const total = Number(/(\d+) requests in/.exec(out)?.[1]);
    if (!Number.isFinite(total)) throw new Error(`cannot read wrk's output:\n${out}`);
    const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
    const sock = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
    const socketErrors = sock ? sock.slice(1).reduce((a, b) => a + Number(b), 0) : 0;
    return { ok: total - non2xx, other: non2xx + socketErrors, seconds: parseDuration(/requests in ([\d.]+\w+),/.exec(out)?.[1] ?? `${seconds}s`) };
  };
  const warm = await wrk(1);
  return { ...(await wrk(SECONDS)), warmup_ok: warm.ok };
}

/** wrk's durations: 5.00s, 999.12ms, 1.00m. */
function parseDuration(s: string): number {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(s);
  if (!m) return SECONDS;
  return Number(m[1]) * ({ us: 1e-6, ms: 1e-3, s: 1, m: 60 } as Record<string, number>)[m[2]!]!;
}

async function bareHttpServer(): Promise<{ url: string; close: () => Promise<void> }> {
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { code?: unknown };
      res.writeHead(202, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ job_id: randomUUID(), status: 'pending', has_code: typeof body.code === 'string' }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const addr = server.address();
  return {
    url: `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}/execute/async`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

async function throughput(engine: EngineName): Promise<void> {
  say(`## 3. Trivial jobs per minute, max_workers = 2 (${engine})`);
  const jobs = Math.max(100, RUNS);
  const db = await freshDatabase();
  const cfg = config(db, { sandbox_engine: engine, max_workers: 2, max_queue_size: 100_000 });
  // Bare loop: two loops of the engine running print(1) back to back.
  const t0 = performance.now();
  await Promise.all([measureBareFloor(cfg, { engine, iterations: jobs / 2 }), measureBareFloor({ ...cfg, workspace: workspace() } as Config, { engine, iterations: jobs / 2 })]);
  const bareRate = (jobs / (performance.now() - t0)) * 60_000;

  const svc = await createService(cfg, { logger: silentLogger });
  await svc.start();
  const t1 = performance.now();
  // All jobs arrive at once (concurrent clients), as a burst would.
  const ids = await Promise.all(
    Array.from({ length: jobs }, async () => {
      const r = await svc.app.request('/execute/async', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ code: 'print(1)' }) });
      return ((await r.json()) as { job_id: string }).job_id;
    }),
  );
  for (const id of ids) {
    const r = await svc.app.request(`/jobs/${id}/result?wait=true&timeout=120`);
    const body = (await r.json()) as { status: string };
    if (body.status !== 'succeeded') throw new Error(`job ${id}: ${JSON.stringify(body)}`);
  }
  const rate = (jobs / (performance.now() - t1)) * 60_000;
  say(`${jobs} jobs submitted at once; from first submission to last completion.`);
  say('');
  say('| bare engine, 2 loops | sandpod, max_workers 2 | share | target | verdict |');
  say('|---|---|---|---|---|');
  say(`| ${bareRate.toFixed(0)}/min | ${rate.toFixed(0)}/min | ${((rate / bareRate) * 100).toFixed(0)} % | ≥ 60 % | ${rate >= 0.6 * bareRate ? 'met' : 'MISSED'} |`);
  say('');
  await svc.stop(5000);
  await db.drop();
}

async function kubernetes(): Promise<void> {
  say('## 4. Kubernetes controller overhead (against the in-repo fake API server)');
  try {
    const mod = (await import('./kubernetes.ts')) as { benchKubernetes?: (o: { runs: number; say: (s: string) => void }) => Promise<void> };
    if (!mod.benchKubernetes) throw new Error('bench/kubernetes.ts exports no benchKubernetes');
    await mod.benchKubernetes({ runs: Math.min(RUNS, 200), say });
  } catch (err) {
    say(`not measured: ${(err as Error).message}`);
  }
  say('');
}

async function history(): Promise<void> {
  const rows = Number(process.env.BENCH_HISTORY_ROWS ?? 1_000_000);
  say(`## 5. History at ${rows.toLocaleString('en')} rows: GET /executions through the app`);
  const db = await freshDatabase();
  const svc = await createService(config(db, { dispatch: false, sandbox_engine: 'process' }), { logger: silentLogger });
  await seedHistory(svc.db.kysely, rows);
  await svc.start();
  say(`${db.kind}; 50 requests per query after 5 warm-ups; newest first, limit 100.`);
  say('');
  say('| query | p50 | p99 |');
  say('|---|---|---|');
  for (const q of ['limit=100', 'limit=100&status=failed', 'limit=100&job_type=data', 'limit=100&status=failed&job_type=data', 'limit=100&offset=10000', 'limit=100&view=full']) {
    const times: number[] = [];
    for (let i = 0; i < 55; i++) {
      const t0 = performance.now();
      const res = await svc.app.request(`/executions?${q}`);
      const body = (await res.json()) as { count: number };
      if (body.count !== 100) throw new Error(`${q}: ${JSON.stringify(body).slice(0, 200)}`);
      if (i >= 5) times.push(performance.now() - t0);
    }
    say(`| \`${q}\` | ${ms(quantile(times, 0.5))} ms | ${ms(quantile(times, 0.99))} ms |`);
  }
  say('');
  await svc.stop(1000);
  await db.drop();
}

type WarmStats = { job_type: string; target: number; ready: number; hits: number; misses: number };

async function warmStats(base: string): Promise<WarmStats> {
  const body = (await getJson(`${base}/pool/stats`)).body as { warm: WarmStats[] };
  const s = body.warm.find((w) => w.job_type === 'default');
  if (!s) throw new Error(`no warm pool for default in /pool/stats: ${JSON.stringify(body.warm)}`);
  return s;
}

/** Waits until the default pool is full again (so the next run is a hit that competes with no refill). */
async function poolFull(base: string): Promise<void> {
  const until = performance.now() + 60_000;
  for (;;) {
    const s = await warmStats(base);
    if (s.ready >= s.target) return;
    if (performance.now() > until) throw new Error(`warm pool did not refill: ${JSON.stringify(s)}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function warmSandboxes(engines: EngineName[]): Promise<void> {
  say('## 7. Warm sandboxes: sync `print(1)` through HTTP on a warm hit vs the cold bare engine');
  const size = 4;
  say(`warm_pool.sizes.default = ${size}. Hits: ${RUNS} sequential runs, each sent once the pool is full again (so it is a hit and no refill competes with it), interleaved in blocks with the floor. Targets: hit p50 ≤ 0.35 × floor p50, hit p99 ≤ floor p50.`);
  say('');
  say('| engine | floor p50 | hit p50 | hit p99 | p50 / floor | hits / runs | refill p50 | verdict |');
  say('|---|---|---|---|---|---|---|---|');
  const concurrent: string[] = [];
  for (const engine of engines) {
    const db = await freshDatabase();
    const cfg = config(db, { sandbox_engine: engine, max_workers: 4, warm_pool: { sizes: { default: size } } });
    const svc = await createService(cfg, { logger: silentLogger });
    await svc.start();
    const server = await listen(svc, 0, '127.0.0.1');
    const addr = server.address();
    const base = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
    const floor: number[] = [];
    const hit: number[] = [];
    const refill: number[] = [];
    const one = async () => {
      const t0 = performance.now();
      const body = (await postJson(`${base}/execute`, { code: 'print(1)' })).body as { stdout?: string };
      const dt = performance.now() - t0;
      if (body.stdout !== '1\n') throw new Error(`unexpected response: ${JSON.stringify(body)}`);
      return { dt };
    };
    await measureBareFloor(cfg, { engine, iterations: 10 });
    for (let i = 0; i < 10; i++) {
      await poolFull(base);
      await one();
    }
    const before = await warmStats(base);
    const block = 20;
    for (let done = 0; done < RUNS; done += block) {
      floor.push(...(await measureBareFloor(cfg, { engine, iterations: block })));
      for (let i = 0; i < block; i++) {
        await poolFull(base);
        hit.push((await one()).dt);
        // How long the pool takes to replace the sandbox this run used.
        const t = performance.now();
        await poolFull(base);
        refill.push(performance.now() - t);
      }
    }
    const after = await warmStats(base);
    const hits = after.hits - before.hits;
    const runs = hits + after.misses - before.misses;
    const f50 = quantile(floor, 0.5);
    const h50 = quantile(hit, 0.5);
    const h99 = quantile(hit, 0.99);
    const r50 = quantile(refill, 0.5);
    const ok = h50 <= 0.35 * f50 && h99 <= f50;
    say(`| ${engine} | ${ms(f50)} ms | ${ms(h50)} ms | ${ms(h99)} ms | ${(h50 / f50).toFixed(2)}× | ${hits} / ${runs} | ${ms(r50)} ms | ${ok ? 'met' : 'MISSED'} |`);

    // 4 concurrent clients, each sending one run per period. The rate: half of what the pool can
    // refill (max_starting = 2 sandboxes at once, each taking the refill time measured above), so
    // 4 runs per 4 × refill p50 in all.
    await poolFull(base);
    const clients = 4;
    const period = clients * Math.max(r50, f50);
    const perClient = Math.max(10, Math.round(RUNS / clients / 2));
    const b2 = await warmStats(base);
    const lat: number[] = [];
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: clients }, async (_, c) => {
        await new Promise((r) => setTimeout(r, (c * period) / clients));
        for (let i = 0; i < perClient; i++) {
          const start = performance.now();
          lat.push((await one()).dt);
          const rest = period - (performance.now() - start);
          if (rest > 0) await new Promise((r) => setTimeout(r, rest));
        }
      }),
    );
    const seconds = (performance.now() - t0) / 1000;
    const a2 = await warmStats(base);
    const h = a2.hits - b2.hits;
    const n = h + a2.misses - b2.misses;
    const ratio = n ? h / n : 0;
    concurrent.push(`| ${engine} | ${clients} × 1 per ${ms(period)} ms (${((clients * perClient) / seconds).toFixed(1)} runs/s) | ${h} / ${n} (${(ratio * 100).toFixed(0)} %) | ${ms(quantile(lat, 0.5))} ms | ${ms(quantile(lat, 0.99))} ms | ≥ 90 % | ${ratio >= 0.9 ? 'met' : 'MISSED'} |`);
    await new Promise<void>((r) => server.close(() => r()));
    await svc.stop(5000);
    await db.drop();
  }
  say('');
  say('Concurrent clients (hits and misses from `/pool/stats`):');
  say('');
  say('| engine | load | hits | p50 | p99 | target | verdict |');
  say('|---|---|---|---|---|---|---|');
  for (const l of concurrent) say(l);
  say('');
}

async function main(): Promise<void> {
  const probe = parseConfig({ workspace: workspace() }, {});
  const detected = await detectEngines(probe);
  const working = (Object.entries(detected.engines) as [EngineName, { works: boolean }][]).filter(([, d]) => d.works).map(([e]) => e);
  const usable = (['bubblewrap', 'gvisor'] as EngineName[]).filter((e) => working.includes(e));
  const engines = process.env.BENCH_ENGINES ? (process.env.BENCH_ENGINES.split(',') as EngineName[]) : usable;
  say(`# sandpod benchmark — ${new Date().toISOString()}`);
  say(`node ${process.version}; engines usable here: ${working.join(', ') || 'none'}; HTTP client: node:http, keep-alive, in this process (bench/http.ts)`);
  say('');
  if (ONLY.has('sync')) await syncLatency(engines);
  if (ONLY.has('accept')) await acceptance();
  if (ONLY.has('throughput')) for (const e of engines) await throughput(e);
  if (ONLY.has('kubernetes')) await kubernetes();
  if (ONLY.has('history')) await history();
  if (ONLY.has('cluster')) await (await import('./cluster.ts')).benchCluster({ runs: Math.min(RUNS, 20), say });
  if (ONLY.has('replicas')) await (await import('./replicas.ts')).benchReplicas(say);
  if (ONLY.has('warm')) await warmSandboxes(engines);
  if (ONLY.has('inflight')) {
    say('## 8. Runs in flight per replica (against the in-repo fake API server)');
    await (await import('./inflight.ts')).benchInflight({ levels: (process.env.BENCH_INFLIGHT ?? '10,100,1000').split(',').map(Number), say });
    say('');
  }
  if (ONLY.has('queued')) {
    say('## 9. Queued async jobs drained at the worker limit (PostgreSQL)');
    await (await import('./queued.ts')).benchQueued({ jobs: Number(process.env.BENCH_QUEUED_JOBS ?? 5000), say });
  }
  if (ONLY.has('work')) await (await import('./work.ts')).benchWork({ engines, runs: RUNS, say });
  mkdirSync('.bench', { recursive: true });
  writeFileSync('.bench/report.md', `${lines.join('\n')}\n`);
  console.log('report written to .bench/report.md');
  closeConnections();
}

await main();
