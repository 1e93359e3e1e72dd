/**
 * The chart's monitoring: the PrometheusRule (only where its CRD is served), checked and unit-tested
 * with promtool as rendered (alerts.promtool.yaml: each alert quiet on healthy series and firing on bad
 * ones), the Grafana dashboard ConfigMap, and the OTEL_* variables of `tracing`.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, expect, it } from 'vitest';
import YAML from 'yaml';
import { byKind, CHART_DIR, describeRendered, one, prepareRenderer, renderOk, TOOL_BUILD_TIMEOUT_MS, validateBuiltin, withDb, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const RULE_API = ['--api-versions', 'monitoring.coreos.com/v1/PrometheusRule'];
const PROMTOOL_TESTS = path.join(path.dirname(fileURLToPath(import.meta.url)), 'alerts.promtool.yaml');
const NO_PROMTOOL = spawnSync('promtool', ['--version'], { encoding: 'utf8' }).error
  ? 'skipped: promtool is not installed (Debian package `prometheus`), so the alert rules are not checked'
  : null;

/** Writes the rendered rule groups as a Prometheus rules file; returns its path. */
function rulesFile(rule: Manifest): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'sandpod-rules-'));
  const file = path.join(dir, 'rules.yaml');
  writeFileSync(file, YAML.stringify({ groups: rule.spec.groups }));
  return file;
}

function promtool(...args: string[]): { status: number | null; out: string } {
  const r = spawnSync('promtool', args, { encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}`.trim() };
}

describeRendered('PrometheusRule', () => {
  it('is rendered only where the CRD is served, and not when disabled', () => {
    expect(byKind(renderOk(withDb()), 'PrometheusRule')).toEqual([]);
    expect(byKind(renderOk(withDb(...RULE_API, '--set', 'prometheusRule.enabled=false')), 'PrometheusRule')).toEqual([]);
    const rule = one(renderOk(withDb(...RULE_API)), 'PrometheusRule');
    expect(rule.metadata).toMatchObject({ name: 'sandpod', namespace: 'sandpod' });
    expect(rule.spec.groups[0].rules.map((r: Manifest) => r.alert)).toEqual([
      'SandpodCircuitBreakerOpen',
      'SandpodDeadLetterQueueGrowing',
      'SandpodQueueNearFull',
      'SandpodWarmPoolHitRatioLow',
      'SandpodInfrastructureFailures',
      'SandpodWebhookDeliveriesFailing',
    ]);
  });

  it('carries the labels the operator selects rules by, and the thresholds of the values', () => {
    const rule = one(renderOk(withDb(...RULE_API, '--set', 'prometheusRule.labels.release=kps', '--set-json', 'prometheusRule.queueNearFullRatio=0.9')), 'PrometheusRule');
    expect(rule.metadata.labels.release).toBe('kps');
    const queue = rule.spec.groups[0].rules.find((r: Manifest) => r.alert === 'SandpodQueueNearFull');
    expect(queue.expr).toMatch(/ > 0\.9$/);
  });

  it.skipIf(NO_PROMTOOL !== null)('passes `promtool check rules` and the alerts\' unit tests (`promtool test rules`)', () => {
    const file = rulesFile(one(renderOk(withDb(...RULE_API)), 'PrometheusRule'));
    expect(promtool('check', 'rules', file)).toMatchObject({ status: 0 });
    const tests = path.join(path.dirname(file), 'tests.yaml');
    writeFileSync(tests, readFileSync(PROMTOOL_TESTS, 'utf8').replace('  - RULES_FILE', `  - ${file}`));
    const r = promtool('test', 'rules', tests);
    expect(r.out).toContain('SUCCESS');
    expect(r.status, r.out).toBe(0);
  });

  it.skipIf(NO_PROMTOOL !== null)('the unit tests fail when an alert is broken (a wrong threshold)', () => {
    const file = rulesFile(one(renderOk(withDb(...RULE_API, '--set-json', 'prometheusRule.queueNearFullRatio=0.95')), 'PrometheusRule'));
    const tests = path.join(path.dirname(file), 'tests.yaml');
    writeFileSync(tests, readFileSync(PROMTOOL_TESTS, 'utf8').replace('  - RULES_FILE', `  - ${file}`));
    const r = promtool('test', 'rules', tests);
    expect(r.status).not.toBe(0);
    expect(r.out).toContain('SandpodQueueNearFull');
  });
});

describeRendered('Grafana dashboard', () => {
  const ON = ['--set', 'grafanaDashboard.enabled=true'];

  it('is a ConfigMap with the sidecar\'s label holding the dashboard JSON', async () => {
    const cm = one(renderOk(withDb(...ON)), 'ConfigMap', 'sandpod-dashboard');
    expect(cm.metadata.labels.grafana_dashboard).toBe('1');
    expect(await validateBuiltin(cm)).toBeNull();
    const dash = JSON.parse(cm.data['sandpod.json']) as { uid: string; panels: { targets: { expr: string }[] }[] };
    expect(dash).toEqual(JSON.parse(readFileSync(path.join(CHART_DIR, 'dashboards/sandpod.json'), 'utf8')));
    expect(dash.uid).toBe('sandpod-overview');
    expect(dash.panels.length).toBeGreaterThan(10);
  });

  it('is off by default; can be labelled otherwise and placed in Grafana\'s namespace', () => {
    expect(byKind(renderOk(withDb()), 'ConfigMap').map((c) => c.metadata.name)).not.toContain('sandpod-dashboard');
    const cm = one(renderOk(withDb(...ON, '--set', 'grafanaDashboard.label=dashboards', '--set', 'grafanaDashboard.labelValue=sandpod', '--set', 'grafanaDashboard.namespace=monitoring')), 'ConfigMap', 'sandpod-dashboard');
    expect(cm.metadata.labels.dashboards).toBe('sandpod');
    expect(cm.metadata.namespace).toBe('monitoring');
  });
});

describeRendered('tracing values', () => {
  const env = (docs: Manifest[]) => Object.fromEntries((one(docs, 'Deployment', 'sandpod').spec.template.spec.containers[0].env as Manifest[]).map((e) => [e.name, e.value ?? e.valueFrom]));

  it('sets no OTEL_* variable by default (tracing off)', () => {
    expect(Object.keys(env(renderOk(withDb()))).filter((k) => k.startsWith('OTEL_'))).toEqual([]);
  });

  it('sets the standard variables from the values when an endpoint is given', () => {
    const e = env(
      renderOk(
        withDb(
          '--set', 'tracing.endpoint=http://otel-collector.observability:4318',
          '--set', 'tracing.sampler=parentbased_traceidratio',
          '--set', 'tracing.samplerArg=0.25',
          '--set', 'tracing.resourceAttributes=deployment.environment=prod',
          '--set', 'tracing.env[0].name=OTEL_EXPORTER_OTLP_HEADERS',
          '--set', 'tracing.env[0].value=x-token=abc',
        ),
      ),
    );
    expect(e).toMatchObject({
      OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel-collector.observability:4318',
      OTEL_SERVICE_NAME: 'sandpod',
      OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
      OTEL_TRACES_SAMPLER_ARG: '0.25',
      OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment=prod',
      OTEL_EXPORTER_OTLP_HEADERS: 'x-token=abc',
    });
  });
});
