/**
 * The SVC_CONFIG file the chart renders is one the service accepts: parsed with the service's own
 * parseConfig, so a renamed or removed key in src/config.ts fails here, not in a cluster.
 */
import * as v from 'valibot';
import YAML from 'yaml';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, expect, it } from 'vitest';
import { ConfigSchema, parseConfig } from '../../../src/config.ts';
import { CHART_DIR, DB_URL, TOOL_BUILD_TIMEOUT_MS, describeRendered, one, prepareRenderer, render, renderOk, withDb } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

/** Keys the chart renders itself (values.schema.json refuses them under `config`). */
const CHART_OWNED = ['runtime', 'kubernetes', 'port', 'host', 'workspace', 'database_url', 'docker_image', 'container_runtime', 'auth', 'webhooks'];
/** Keys of the local runtime only: meaningless in a cluster, refused under `config`. */
const LOCAL_ONLY = ['sandbox_engine', 'gvisor_platform', 'python_interpreters', 'warm_pool'];

/** The env the API container gets (SVC_CONFIG aside). */
const POD_ENV = { SVC_DATABASE_URL: DB_URL, SVC_WORKSPACE: '/tmp/sandpod' };

function renderedConfig(args: string[] = []): unknown {
  const cm = one(renderOk(withDb(...args)), 'ConfigMap');
  return YAML.parse(cm.data['config.yaml']) as unknown;
}

describeRendered('rendered SVC_CONFIG', () => {
  it('parses with the service’s parseConfig and selects the Kubernetes runtime', () => {
    const cfg = parseConfig(renderedConfig(), POD_ENV);
    expect(cfg.runtime).toBe('kubernetes');
    expect(cfg.database_url).toBe(DB_URL);
    expect(cfg.port).toBe(8000);
    expect(cfg.security_mode).toBe('strict');
    expect(cfg.docker_image).toBe('ghcr.io/sandpod/executor:0.1.0');
    expect(cfg.container_runtime).toBe('gvisor');
    expect(cfg.kubernetes).toEqual({
      namespace: 'sandpod',
      runs_namespace: 'sandpod-jobs',
      instance: 'sandpod',
      runtime_class: 'gvisor',
      executor_image: 'ghcr.io/sandpod/executor:0.1.0',
      // A tag (appVersion) and no digest: Always (a digest gives IfNotPresent; isolation.test.ts).
      image_pull_policy: 'Always',
      ttl_seconds_after_finished: 600,
      deadline_grace_seconds: 30,
      watch_job_types: true,
      preflight: true,
      network_check_service: 'sandpod',
      runtime_class_network_none: null,
      cpu_request_fraction: 0.25,
      memory_request_fraction: 0.5,
      api_timeout_seconds: 30,
      watch_timeout_seconds: 60,
      leader_election: { enabled: true, lease_name: 'sandpod-leader', lease_duration_seconds: 15, renew_deadline_seconds: 10, retry_period_seconds: 2 },
      egress_proxy: { url: 'http://sandpod-egress-proxy.sandpod.svc.cluster.local:3128', key_file: '/etc/sandpod/egress/key' },
      build_registry: null,
      build_registry_secret: null,
      build_registry_insecure: false,
      build_platform: 'linux/amd64',
      build_cpu: '1',
      build_memory: '2Gi',
      build_ephemeral_storage: '4Gi',
      warm_pool_size: 1,
      warm_pool_max_idle_seconds: 900,
      cold_start: 'attach',
    });
  });

  it('follows the release, the runs namespace, the runtime class and the executor image', () => {
    const cm = one(
      renderOk(
        withDb(
          '--set',
          'runs.namespace=runs',
          '--set',
          'runtimeClass.name=sandbox',
          '--set',
          'executorImage.repository=registry.local/exec',
          '--set',
          'executorImage.tag=2.0.0',
          '--set',
          'executorImage.pullPolicy=Always',
          '--set',
          'runs.ttlSecondsAfterFinished=60',
          '--set',
          'jobTypes.watch=false',
          '--set',
          'runs.requests.cpuFraction=1',
          '--set',
          'runs.requests.memoryFraction=1',
          '--set',
          'runs.apiTimeoutSeconds=10',
          '--set',
          'runs.watchTimeoutSeconds=120',
        ),
        { release: 'sp', namespace: 'svc' },
      ),
      'ConfigMap',
    );
    const cfg = parseConfig(YAML.parse(cm.data['config.yaml']), POD_ENV);
    expect(cfg.kubernetes).toMatchObject({
      namespace: 'svc',
      runs_namespace: 'runs',
      instance: 'sp',
      runtime_class: 'sandbox',
      executor_image: 'registry.local/exec:2.0.0',
      image_pull_policy: 'Always',
      cpu_request_fraction: 1,
      memory_request_fraction: 1,
      api_timeout_seconds: 10,
      watch_timeout_seconds: 120,
      ttl_seconds_after_finished: 60,
      watch_job_types: false,
    });
    expect(cfg.docker_image).toBe('registry.local/exec:2.0.0');
    expect(cfg.container_runtime).toBe('sandbox');
  });

  it('renders runs.warmPool.sessionSizes as warm_pool.session_sizes (null: the service default)', () => {
    expect(parseConfig(renderedConfig(), POD_ENV).warm_pool.session_sizes).toBeNull();
    const set = parseConfig(renderedConfig(['--set', 'runs.warmPool.sessionSizes.default=2', '--set', 'runs.warmPool.sessionSizes.ml=0']), POD_ENV);
    expect(set.warm_pool.session_sizes).toEqual({ default: 2, ml: 0 });
    // An empty map keeps none configured (not the default).
    expect(parseConfig(renderedConfig(['--set-json', 'runs.warmPool.sessionSizes={}']), POD_ENV).warm_pool.session_sizes).toEqual({});
    const over = render(withDb('--set', 'runs.warmPool.sessionSizes.default=17'));
    expect(over.code).not.toBe(0);
    expect(over.stderr).toMatch(/sessionSizes/);
  });

  it('passes every user-settable key through with its value', () => {
    const raw = renderedConfig([
      '--set',
      'config.max_code_bytes=2048',
      '--set',
      'config.log_level=debug',
      '--set-json',
      'config.retry={"attempts":3,"base_delay_ms":500}',
      '--set-json',
      'config.job_types=[{"name":"custom","memory_limit":"2g","network":{"mode":"bridge","allowed_hosts":["a.example"]}}]',
    ]);
    const cfg = parseConfig(raw, POD_ENV);
    expect(cfg.max_code_bytes).toBe(2048);
    expect(cfg.log_level).toBe('debug');
    expect(cfg.retry).toEqual({ attempts: 3, base_delay_ms: 500 });
    expect(cfg.job_types[0]).toMatchObject({ name: 'custom', memory_limit: '2g' });
  });

  it('values.schema.json covers exactly the ConfigSchema keys the chart does not own (no drift)', () => {
    const schema = JSON.parse(readFileSync(path.join(CHART_DIR, 'values.schema.json'), 'utf8'));
    const userKeys = Object.keys(schema.properties.config.properties).sort();
    const object = ConfigSchema.pipe[0] as v.StrictObjectSchema<v.ObjectEntries, undefined>;
    const serviceKeys = Object.keys(object.entries).sort();
    // A key in values.schema.json that the service does not know would crash the pods at start.
    expect(userKeys.filter((k) => !serviceKeys.includes(k))).toEqual([]);
    // A new service key must be settable (add it to values.schema.json `config`) or chart-owned.
    const unaccounted = serviceKeys.filter((k) => ![...userKeys, ...CHART_OWNED, ...LOCAL_ONLY].includes(k));
    expect(unaccounted, 'add these to charts/sandpod/values.schema.json config.properties').toEqual([]);
    for (const k of [...CHART_OWNED, ...LOCAL_ONLY]) expect(serviceKeys).toContain(k);
  });

  it('the chart fills every key of the service’s kubernetes block', () => {
    const object = ConfigSchema.pipe[0] as v.StrictObjectSchema<v.ObjectEntries, undefined>;
    const k8s = (object.entries.kubernetes as unknown as { wrapped: v.ObjectSchema<v.ObjectEntries, undefined> }).wrapped;
    const rendered = (renderedConfig() as { kubernetes: Record<string, unknown> }).kubernetes;
    expect(Object.keys(rendered).sort()).toEqual(Object.keys(k8s.entries).sort());
  });
});
