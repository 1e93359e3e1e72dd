/**
 * Every metric the chart's Grafana dashboard and alert rules query is one a real service's /metrics
 * exposes (with its histogram series), so no panel or alert watches a name that does not exist.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { CHART_DIR, describeRendered, one, prepareRenderer, renderOk, TOOL_BUILD_TIMEOUT_MS, withDb } from '../../support/chart.ts';
import { startTestService, type TestService } from '../../support/service.ts';

let svc: TestService;
beforeAll(async () => {
  prepareRenderer();
  svc = await startTestService();
}, TOOL_BUILD_TIMEOUT_MS);
afterAll(async () => {
  await svc?.close();
});

/** Series names /metrics can carry: each metric's name, and a histogram's _bucket, _sum and _count. */
async function exposedSeries(): Promise<Set<string>> {
  const text = await (await svc.get('/metrics')).text();
  const out = new Set<string>();
  for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    out.add(m[1]!);
    if (m[2] === 'histogram' || m[2] === 'summary') for (const s of ['_bucket', '_sum', '_count']) out.add(`${m[1]}${s}`);
  }
  return out;
}

/** The metric names a PromQL expression selects (ours and the standard process/Node.js ones). */
function metricNames(expr: string): string[] {
  return [...expr.matchAll(/\b((?:sandpod|process|nodejs)_[a-z0-9_]+)\b/g)].map((m) => m[1]!);
}

describeRendered('monitoring queries', () => {
  it('the dashboard and the alert rules use only metrics /metrics exposes', async () => {
    const exposed = await exposedSeries();
    const dashboard = JSON.parse(readFileSync(path.join(CHART_DIR, 'dashboards/sandpod.json'), 'utf8')) as { panels: { title: string; targets: { expr: string }[] }[]; templating: { list: { type: string; query?: unknown }[] } };
    const rule = one(renderOk(withDb('--api-versions', 'monitoring.coreos.com/v1/PrometheusRule')), 'PrometheusRule');
    const queries: [string, string][] = [
      ...dashboard.panels.flatMap((p) => p.targets.map((t): [string, string] => [`panel ${p.title}`, t.expr])),
      ...dashboard.templating.list.filter((v) => v.type === 'query' && typeof v.query === 'string').map((v): [string, string] => ['variable', v.query as string]),
      ...(rule.spec.groups[0].rules as { alert: string; expr: string }[]).map((r): [string, string] => [`alert ${r.alert}`, r.expr]),
    ];
    const used = new Set<string>();
    const missing: string[] = [];
    for (const [where, expr] of queries) {
      const names = metricNames(expr);
      // Every query names at least one metric (a regex that missed them all would check nothing).
      expect(names.length, `${where}: ${expr}`).toBeGreaterThan(0);
      for (const n of names) {
        used.add(n);
        if (!exposed.has(n)) missing.push(`${where}: ${n}`);
      }
    }
    expect(missing).toEqual([]);
    // The names the alerts are about are among them.
    for (const n of ['sandpod_circuit_breaker_state', 'sandpod_dlq_entries', 'sandpod_queue_depth', 'sandpod_queue_max_size', 'sandpod_warm_claims_total', 'sandpod_runs_total', 'sandpod_webhook_deliveries_total']) expect(used).toContain(n);
  });
});
