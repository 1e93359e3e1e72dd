/**
 * GET /metrics of a real service: HTTP requests are counted under route templates (never raw paths),
 * the process and Node.js metrics keep their standard names, and `promtool check metrics` accepts
 * the whole exposition.
 */
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UNMATCHED_ROUTE } from '../../../src/api/middleware/http-metrics.ts';
import { startTestService, type TestService } from '../../support/service.ts';

let svc: TestService;
beforeAll(async () => {
  svc = await startTestService();
});
afterAll(async () => {
  await svc?.close();
});

async function scrape(): Promise<string> {
  const res = await svc.get('/metrics');
  expect(res.status).toBe(200);
  return res.text();
}

/** The value of one sample (`name{labels} value`), 0 when absent. */
function sample(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : 0;
}

describe('HTTP request metrics', () => {
  it('counts /jobs/<id> under the route template, and no raw id reaches /metrics', async () => {
    const id = randomUUID();
    const series = 'sandpod_http_requests_total{method="GET",route="/jobs/:id",status="404"}';
    const before = sample(await scrape(), series);
    expect((await svc.get(`/jobs/${id}`)).status).toBe(404);
    expect((await svc.get(`/jobs/${id}/result`)).status).toBe(404);
    const text = await scrape();
    expect(sample(text, series)).toBe(before + 1);
    expect(sample(text, 'sandpod_http_requests_total{method="GET",route="/jobs/:id/result",status="404"}')).toBeGreaterThanOrEqual(1);
    expect(text).toMatch(/^sandpod_http_request_duration_seconds_count\{method="GET",route="\/jobs\/:id"\} \d+$/m);
    expect(text).not.toContain(id);
  });

  it('puts requests that match no route under one fixed label, whatever their path or method', async () => {
    const noise = randomUUID();
    const series = `sandpod_http_requests_total{method="GET",route="${UNMATCHED_ROUTE}",status="404"}`;
    const before = sample(await scrape(), series);
    for (const p of [`/${noise}`, `/a/${noise}/b`, `/jobs/${noise}/nothing-here`]) expect((await svc.get(p)).status).toBe(404);
    const odd = await svc.app.request(`/${noise}`, { method: 'PROPFIND' });
    expect(odd.status).toBe(404);
    const text = await scrape();
    expect(sample(text, series)).toBe(before + 3);
    expect(sample(text, `sandpod_http_requests_total{method="OTHER",route="${UNMATCHED_ROUTE}",status="404"}`)).toBeGreaterThanOrEqual(1);
    expect(text).not.toContain(noise);
    expect(text).not.toContain('PROPFIND');
  });

  it('labels a run by the status it answered with', async () => {
    const res = await svc.post('/execute', { code: 'print(1)' });
    expect(res.status).toBe(200);
    expect(sample(await scrape(), 'sandpod_http_requests_total{method="POST",route="/execute",status="200"}')).toBe(1);
  });
});

describe('exposition', () => {
  it('process and Node.js metrics carry their standard, unprefixed names', async () => {
    const text = await scrape();
    for (const name of ['process_cpu_seconds_total', 'process_resident_memory_bytes', 'process_start_time_seconds', 'nodejs_heap_size_used_bytes', 'nodejs_eventloop_lag_seconds', 'nodejs_active_handles']) {
      expect(text).toContain(`# TYPE ${name} `);
    }
    expect(text).not.toMatch(/^# TYPE sandpod_(process|nodejs)_/m);
    // Every *_total is a counter (the gauges prom-client names *_total are left out).
    for (const m of text.matchAll(/^# TYPE (\S+_total) (\S+)$/gm)) expect(m[2], m[1]).toBe('counter');
  });

  it('passes `promtool check metrics`', async (ctx) => {
    const text = await scrape();
    // Runs and HTTP series have samples by now, so their label sets are checked too.
    expect(text).toContain('sandpod_runs_total{');
    const probe = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
    if (probe.error) {
      const why = 'skipped: promtool is not installed (Debian package `prometheus`), so the exposition is not linted';
      console.warn(why); // the default reporter prints no skip notes
      ctx.skip(why);
    }
    const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
    expect({ status: r.status, out: `${r.stdout}${r.stderr}`.trim() }).toEqual({ status: 0, out: '' });
  });
});
