/**
 * The chart's egress proxy (issue #13 point 1): its Deployment, Service and key Secret, the config
 * that points the service at it, and the NetworkPolicies — run pods behind the proxy reach only the
 * proxy, the proxy takes connections only from them. Selectors are checked against the labels the
 * service's own Job builder puts on a run pod of the rendered config.
 */
import * as v from 'valibot';
import YAML from 'yaml';
import { beforeAll, describe, expect, it } from 'vitest';
import { JobTypeConfigSchema, parseConfig, type Config } from '../../../src/config.ts';
import { MIN_KEY_BYTES, verifyEgressToken } from '../../../src/egress/token.ts';
import { fromConfig } from '../../../src/jobtypes/job-type.ts';
import { buildJob } from '../../../src/runtime/kubernetes/runs/build-job.ts';
import type { RunSpec } from '../../../src/runtime/runtime.ts';
import {
  DB_URL,
  TOOL_BUILD_TIMEOUT_MS,
  byKind,
  describeRendered,
  one,
  prepareRenderer,
  renderOk,
  restrictedViolations,
  validateBuiltin,
  withDb,
  type Manifest,
} from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

type Selector = { matchLabels?: Record<string, string>; matchExpressions?: { key: string; operator: string; values?: string[] }[] };

/** Whether a label selector selects an object with `labels` (the API server's rule, for the operators used here). */
function selects(sel: Selector, labels: Record<string, string>): boolean {
  for (const [k, val] of Object.entries(sel.matchLabels ?? {})) if (labels[k] !== val) return false;
  for (const e of sel.matchExpressions ?? []) {
    if (e.operator === 'DoesNotExist' && e.key in labels) return false;
    if (e.operator === 'Exists' && !(e.key in labels)) return false;
    if (e.operator === 'In' && !e.values!.includes(labels[e.key]!)) return false;
    if (e.operator === 'NotIn' && e.values!.includes(labels[e.key]!)) return false;
  }
  return true;
}

const jt = (o: Record<string, unknown>) => fromConfig(v.parse(JobTypeConfigSchema, o));
const runSpec = (jobType: RunSpec['jobType']): RunSpec => ({
  executionId: '3f2b8c1e-6a0d-4e7b-9f35-0c1d2e3f4a5b',
  code: 'print(1)\n',
  inputJson: '{}',
  jobType,
  timeoutSec: 30,
  startupTimeoutSec: 60,
  requirements: [],
  maxStdoutBytes: 1024,
  maxArtifactBytes: 1024,
});
const proxiedType = jt({ name: 'http', network: { mode: 'bridge', allowed_hosts: ['api.github.com'] } });
const openBridgeType = jt({ name: 'open', network: { mode: 'bridge' } });

function renderedConfig(docs: Manifest[]): Config {
  return parseConfig(YAML.parse(one(docs, 'ConfigMap').data['config.yaml']), { SVC_DATABASE_URL: DB_URL, SVC_WORKSPACE: '/tmp/sandpod' });
}

describeRendered('egress proxy', () => {
  let docs: Manifest[];
  let config: Config;
  let key: string;
  beforeAll(() => {
    docs = renderOk(withDb());
    config = renderedConfig(docs);
    key = Buffer.from(one(docs, 'Secret', 'sandpod-egress-key').data.key, 'base64').toString();
  });
  const proxyDeployment = () => one(docs, 'Deployment', 'sandpod-egress-proxy');
  const podLabelsOf = (jobType: RunSpec['jobType']) =>
    buildJob(runSpec(jobType), jobType, config, { runtimeClassName: 'gvisor', sources: 'sandpod-runner-test', egressProxy: { key, nowMs: 0 } }).job.spec!.template.metadata!.labels!;

  it('is valid Kubernetes, restricted, and runs the compiled proxy from the API image', async () => {
    for (const d of [proxyDeployment(), one(docs, 'Service', 'sandpod-egress-proxy'), one(docs, 'Secret', 'sandpod-egress-key')]) {
      expect(await validateBuiltin(d), `${d.kind} ${d.metadata.name}`).toBeNull();
    }
    const pod = proxyDeployment().spec.template.spec;
    expect(restrictedViolations(pod)).toEqual([]);
    expect(pod.automountServiceAccountToken).toBe(false);
    const c = pod.containers[0];
    expect(c.command).toEqual(['node', 'dist/egress/main.js']);
    expect(c.image).toBe(one(docs, 'Deployment', 'sandpod').spec.template.spec.containers[0].image);
    expect(c.ports).toEqual([
      { name: 'proxy', containerPort: 3128, protocol: 'TCP' },
      { name: 'health', containerPort: 8081, protocol: 'TCP' },
    ]);
    const env = Object.fromEntries(c.env.map((e: Manifest) => [e.name, e.value]));
    expect(env.SANDPOD_EGRESS_PORT).toBe('3128');
    const mount = c.volumeMounts.find((m: Manifest) => m.name === 'key');
    expect(`${mount.mountPath}/key`).toBe(env.SANDPOD_EGRESS_KEY_FILE);
    expect(pod.volumes.find((x: Manifest) => x.name === 'key').secret.secretName).toBe('sandpod-egress-key');
  });

  it('probes over HTTP on the health port (readiness sees saturation), and passes the connection limits and deadlines', () => {
    const c = proxyDeployment().spec.template.spec.containers[0];
    expect(c.readinessProbe).toMatchObject({ httpGet: { path: '/readyz', port: 'health' } });
    expect(c.livenessProbe).toMatchObject({ httpGet: { path: '/livez', port: 'health' } });
    expect(c.readinessProbe.tcpSocket).toBeUndefined();
    const env = Object.fromEntries(c.env.map((e: Manifest) => [e.name, e.value]));
    expect(env).toMatchObject({
      SANDPOD_EGRESS_HEALTH_PORT: '8081',
      SANDPOD_EGRESS_MAX_CONNECTIONS: '1024',
      SANDPOD_EGRESS_MAX_CONNECTIONS_PER_RUN: '64',
      SANDPOD_EGRESS_MAX_PENDING_PER_SOURCE: '64',
      SANDPOD_EGRESS_HEAD_TIMEOUT_MS: '10000',
      SANDPOD_EGRESS_IDLE_TIMEOUT_MS: '300000',
    });
    // Run pods may reach the proxy port only, never the probes.
    expect(one(docs, 'NetworkPolicy', 'sandpod-egress-proxy').spec.ingress[0].ports).toEqual([{ protocol: 'TCP', port: 3128 }]);
    const d = renderOk(withDb('--set', 'egressProxy.healthPort=9090', '--set', 'egressProxy.headTimeoutSeconds=3', '--set', 'egressProxy.idleTimeoutSeconds=60', '--set', 'egressProxy.maxConnectionsPerRun=8'));
    const c2 = one(d, 'Deployment', 'sandpod-egress-proxy').spec.template.spec.containers[0];
    expect(c2.ports[1]).toEqual({ name: 'health', containerPort: 9090, protocol: 'TCP' });
    expect(Object.fromEntries(c2.env.map((e: Manifest) => [e.name, e.value]))).toMatchObject({
      SANDPOD_EGRESS_HEALTH_PORT: '9090',
      SANDPOD_EGRESS_HEAD_TIMEOUT_MS: '3000',
      SANDPOD_EGRESS_IDLE_TIMEOUT_MS: '60000',
      SANDPOD_EGRESS_MAX_CONNECTIONS_PER_RUN: '8',
    });
  });

  it('a generated key, long enough, mounted in the API pods where SVC_CONFIG says', () => {
    expect(Buffer.byteLength(key)).toBeGreaterThanOrEqual(MIN_KEY_BYTES);
    expect(config.kubernetes.egress_proxy).toEqual({ url: 'http://sandpod-egress-proxy.sandpod.svc.cluster.local:3128', key_file: '/etc/sandpod/egress/key' });
    const api = one(docs, 'Deployment', 'sandpod').spec.template.spec;
    const mount = api.containers[0].volumeMounts.find((m: Manifest) => m.name === 'egress-key');
    expect(`${mount.mountPath}/key`).toBe(config.kubernetes.egress_proxy!.key_file);
    expect(api.volumes.find((x: Manifest) => x.name === 'egress-key').secret).toMatchObject({ secretName: 'sandpod-egress-key', items: [{ key: 'key', path: 'key' }] });
  });

  it('the Service selects the proxy pods on the port of the configured URL; nothing of the API selects them', () => {
    const svc = one(docs, 'Service', 'sandpod-egress-proxy');
    const proxyPod = proxyDeployment().spec.template.metadata.labels;
    expect(selects({ matchLabels: svc.spec.selector }, proxyPod)).toBe(true);
    expect(svc.spec.ports[0]).toMatchObject({ port: 3128, targetPort: 'proxy' });
    const url = new URL(config.kubernetes.egress_proxy!.url);
    expect(url.hostname).toBe(`${svc.metadata.name}.${svc.metadata.namespace}.svc.cluster.local`);
    expect(Number(url.port)).toBe(svc.spec.ports[0].port);
    // The API Service, its PDB and its NetworkPolicy must not pick up proxy pods (nor the proxy's the API's).
    expect(selects({ matchLabels: one(docs, 'Service', 'sandpod').spec.selector }, proxyPod)).toBe(false);
    expect(selects(one(docs, 'PodDisruptionBudget').spec.selector, proxyPod)).toBe(false);
    expect(selects(one(docs, 'NetworkPolicy', 'sandpod-api').spec.podSelector, proxyPod)).toBe(false);
    expect(selects({ matchLabels: svc.spec.selector }, one(docs, 'Deployment', 'sandpod').spec.template.metadata.labels)).toBe(false);
  });

  it('a run pod of a bridge type with allowed_hosts: only the proxy policy applies, and it reaches the proxy pods only (no DNS)', () => {
    const labels = podLabelsOf(proxiedType);
    const policies = byKind(docs, 'NetworkPolicy').filter((p) => p.metadata.namespace === 'sandpod-jobs' && selects(p.spec.podSelector, labels));
    expect(policies.map((p) => p.metadata.name).sort()).toEqual(['sandpod-runs-default-deny', 'sandpod-runs-egress-proxy']);
    const np = one(docs, 'NetworkPolicy', 'sandpod-runs-egress-proxy');
    expect(np.spec.policyTypes).toEqual(['Egress']);
    expect(np.spec.egress).toHaveLength(1);
    const toProxy = np.spec.egress[0];
    expect(toProxy.ports).toEqual([{ protocol: 'TCP', port: 3128 }]);
    expect(toProxy.to).toHaveLength(1);
    expect(toProxy.to[0].namespaceSelector).toEqual({ matchLabels: { 'kubernetes.io/metadata.name': 'sandpod' } });
    expect(selects(toProxy.to[0].podSelector, proxyDeployment().spec.template.metadata.labels)).toBe(true);
    expect(selects(toProxy.to[0].podSelector, one(docs, 'Deployment', 'sandpod').spec.template.metadata.labels)).toBe(false);
    expect(toProxy.to[0].ipBlock).toBeUndefined();
  });

  it('a bridge type without allowed_hosts keeps the CIDR policy and cannot reach the proxy', () => {
    const labels = podLabelsOf(openBridgeType);
    expect(labels['sandpod.io/egress']).toBeUndefined();
    expect(selects(one(docs, 'NetworkPolicy', 'sandpod-runs-bridge-egress').spec.podSelector, labels)).toBe(true);
    expect(selects(one(docs, 'NetworkPolicy', 'sandpod-runs-egress-proxy').spec.podSelector, labels)).toBe(false);
    expect(selects(one(docs, 'NetworkPolicy', 'sandpod-egress-proxy').spec.ingress[0].from[0].podSelector, labels)).toBe(false);
  });

  it('the proxy takes connections from this release’s proxied run pods only, and goes out to DNS and the allowed CIDRs', () => {
    const np = one(docs, 'NetworkPolicy', 'sandpod-egress-proxy');
    expect(np.metadata.namespace).toBe('sandpod');
    expect(selects(np.spec.podSelector, proxyDeployment().spec.template.metadata.labels)).toBe(true);
    expect(np.spec.policyTypes).toEqual(['Ingress', 'Egress']);
    expect(np.spec.ingress).toHaveLength(1);
    expect(np.spec.ingress[0].ports).toEqual([{ protocol: 'TCP', port: 3128 }]);
    expect(np.spec.ingress[0].from).toHaveLength(1);
    const from = np.spec.ingress[0].from[0];
    expect(from.namespaceSelector).toEqual({ matchLabels: { 'kubernetes.io/metadata.name': 'sandpod-jobs' } });
    expect(selects(from.podSelector, podLabelsOf(proxiedType))).toBe(true);
    expect(selects(from.podSelector, { ...podLabelsOf(proxiedType), 'sandpod.io/instance': 'another-release' })).toBe(false);
    expect(np.spec.egress.map((e: Manifest) => e.to.map((t: Manifest) => t.ipBlock?.cidr ?? 'dns'))).toEqual([['dns'], ['0.0.0.0/0', '::/0']]);
  });

  it('by default the proxy\'s internet egress excludes private, CGNAT, link-local and loopback ranges', () => {
    const np = one(docs, 'NetworkPolicy', 'sandpod-egress-proxy');
    expect(np.spec.egress[1].to).toEqual([
      { ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '169.254.0.0/16', '127.0.0.0/8'] } },
      { ipBlock: { cidr: '::/0', except: ['fc00::/7', 'fe80::/10', '::1/128'] } },
    ]);
    // No port limit by default: the run's allowedHosts decide.
    expect(np.spec.egress[1].ports).toBeUndefined();
  });

  it('the excluded ranges can be overridden (an internal host reached on purpose)', () => {
    const d = renderOk(withDb('--set-json', 'egressProxy.allowedCIDRs=[{"cidr":"0.0.0.0/0","except":["169.254.0.0/16"]},"10.20.0.0/16"]'));
    expect(one(d, 'NetworkPolicy', 'sandpod-egress-proxy').spec.egress[1].to).toEqual([
      { ipBlock: { cidr: '0.0.0.0/0', except: ['169.254.0.0/16'] } },
      { ipBlock: { cidr: '10.20.0.0/16' } },
    ]);
  });

  it('the credential the builder signs with the rendered config verifies with the rendered key', () => {
    const cmd = buildJob(runSpec(proxiedType), proxiedType, config, { runtimeClassName: 'gvisor', sources: 'sandpod-runner-test', egressProxy: { key, nowMs: 0 } }).job.spec!.template.spec!.containers[0]!.command!;
    const url = new URL(cmd[cmd.findLastIndex((a) => a.startsWith('HTTP_PROXY=')) ]!.slice('HTTP_PROXY='.length));
    expect(url.hostname).toBe('sandpod-egress-proxy.sandpod.svc.cluster.local');
    expect(verifyEgressToken(url.password, key, 1000)).toMatchObject({ grant: { executionId: runSpec(proxiedType).executionId, allowedHosts: ['api.github.com'] } });
  });

  it('follows egressProxy.port, allowedCIDRs and ports', () => {
    const d = renderOk(withDb('--set', 'egressProxy.port=8888', '--set', 'egressProxy.allowedCIDRs[0]=203.0.113.0/24', '--set', 'egressProxy.ports[0].port=443'));
    expect(renderedConfig(d).kubernetes.egress_proxy!.url).toBe('http://sandpod-egress-proxy.sandpod.svc.cluster.local:8888');
    expect(one(d, 'Service', 'sandpod-egress-proxy').spec.ports[0].port).toBe(8888);
    expect(one(d, 'NetworkPolicy', 'sandpod-runs-egress-proxy').spec.egress[0].ports).toEqual([{ protocol: 'TCP', port: 8888 }]);
    const np = one(d, 'NetworkPolicy', 'sandpod-egress-proxy');
    expect(np.spec.ingress[0].ports).toEqual([{ protocol: 'TCP', port: 8888 }]);
    expect(np.spec.egress[1]).toEqual({ to: [{ ipBlock: { cidr: '203.0.113.0/24' } }], ports: [{ protocol: 'TCP', port: 443 }] });
  });

  describe('egressProxy.enabled=false', () => {
    it('renders no proxy, no key, no proxy policy, and the service is not configured for one (allowed_hosts unenforced)', () => {
      const d = renderOk(withDb('--set', 'egressProxy.enabled=false'));
      expect(d.filter((o) => /egress-(proxy|key)/.test(o.metadata?.name ?? '')).map((o) => `${o.kind} ${o.metadata.name}`)).toEqual([]);
      expect(renderedConfig(d).kubernetes.egress_proxy).toBeNull();
      expect(one(d, 'Deployment', 'sandpod').spec.template.spec.volumes.map((x: Manifest) => x.name)).not.toContain('egress-key');
      const cfg = renderedConfig(d);
      const labels = buildJob(runSpec(proxiedType), proxiedType, cfg, { runtimeClassName: 'gvisor', sources: 'sandpod-runner-test', egressProxy: null }).job.spec!.template.metadata!.labels!;
      expect(selects(one(d, 'NetworkPolicy', 'sandpod-runs-bridge-egress').spec.podSelector, labels)).toBe(true);
    });
  });
});
