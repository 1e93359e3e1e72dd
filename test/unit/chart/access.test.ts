/**
 * What a stranger's install gets for access and monitoring (issue #13 points 2 and 3): API tokens in
 * a generated Secret the service reads as a file, a NetworkPolicy in front of the API pods, a
 * ServiceMonitor only where its CRD is served, and NOTES.txt that says how to reach and authenticate.
 */
import { beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.ts';
import { TokenSet } from '../../../src/api/middleware/auth.ts';
import { silentLogger } from '../../../src/logger.ts';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { RENDERER, TOOL_BUILD_TIMEOUT_MS, byKind, describeRendered, one, prepareRenderer, render, renderOk, validateBuiltin, withDb, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const SM_API = ['--api-versions', 'monitoring.coreos.com/v1/ServiceMonitor'];
const container = (docs: Manifest[]) => one(docs, 'Deployment', 'sandpod').spec.template.spec.containers[0];
const env = (docs: Manifest[]) => Object.fromEntries((container(docs).env as { name: string; value?: string }[]).map((e) => [e.name, e.value]));

describeRendered('API tokens', () => {
  it('on by default: a generated Secret (kept across uninstalls) mounted as a whole volume, named by SVC_API_TOKENS_FILE', () => {
    const docs = renderOk(withDb());
    const secret = one(docs, 'Secret', 'sandpod-api-tokens');
    expect(secret.metadata.annotations['helm.sh/resource-policy']).toBe('keep');
    const token = Buffer.from(secret.data.tokens, 'base64').toString();
    expect(token).toMatch(/^[A-Za-z0-9]{48}$/);
    expect(env(docs).SVC_API_TOKENS_FILE).toBe('/etc/sandpod/auth/tokens');
    const mount = container(docs).volumeMounts.find((m: Manifest) => m.name === 'api-tokens');
    expect(mount).toEqual({ name: 'api-tokens', mountPath: '/etc/sandpod/auth', readOnly: true });
    expect(mount.subPath).toBeUndefined();
    const vol = one(docs, 'Deployment', 'sandpod').spec.template.spec.volumes.find((v: Manifest) => v.name === 'api-tokens');
    expect(vol.secret).toMatchObject({ secretName: 'sandpod-api-tokens', items: [{ key: 'tokens', path: 'tokens' }] });
    // The service accepts what the chart generates (the file as the kubelet writes it).
    const dir = mkdtempSync(path.join(tmpdir(), 'chart-tokens-'));
    writeFileSync(path.join(dir, 'tokens'), token);
    const set = new TokenSet({ tokens: [], tokensFile: path.join(dir, 'tokens') }, { now: () => 0 }, silentLogger);
    expect(set.accepts(token)).toBe(true);
    expect(set.accepts(token.slice(1))).toBe(false);
    // The env var the chart sets is the one the service reads.
    expect(parseConfig({}, { SVC_API_TOKENS_FILE: env(docs).SVC_API_TOKENS_FILE }).auth.tokens_file).toBe('/etc/sandpod/auth/tokens');
  });

  it('an existing Secret and key are used instead, and nothing is generated', () => {
    const docs = renderOk(withDb('--set', 'auth.existingSecret=my-tokens', '--set', 'auth.existingSecretKey=api'));
    expect(byKind(docs, 'Secret').map((s) => s.metadata.name)).not.toContain('sandpod-api-tokens');
    const vol = one(docs, 'Deployment', 'sandpod').spec.template.spec.volumes.find((v: Manifest) => v.name === 'api-tokens');
    expect(vol.secret).toMatchObject({ secretName: 'my-tokens', items: [{ key: 'api', path: 'tokens' }] });
  });

  it('auth.enabled=false: no Secret, no mount, no variable', () => {
    const docs = renderOk(withDb('--set', 'auth.enabled=false'));
    expect(byKind(docs, 'Secret').map((s) => s.metadata.name)).not.toContain('sandpod-api-tokens');
    expect(env(docs).SVC_API_TOKENS_FILE).toBeUndefined();
    expect(container(docs).volumeMounts.map((m: Manifest) => m.name)).not.toContain('api-tokens');
  });
});

describeRendered('API NetworkPolicy', () => {
  const apiPolicy = (docs: Manifest[]) => one(docs, 'NetworkPolicy', 'sandpod-api');

  it('selects the API pods and admits port 8000 only from the ingress controller namespace by default', async () => {
    const docs = renderOk(withDb());
    const np = apiPolicy(docs);
    expect(np.metadata.namespace).toBe('sandpod');
    const podLabels = one(docs, 'Deployment', 'sandpod').spec.template.metadata.labels;
    for (const [k, v] of Object.entries(np.spec.podSelector.matchLabels)) expect(podLabels[k]).toBe(v);
    expect(np.spec.policyTypes).toEqual(['Ingress']);
    expect(np.spec.ingress).toEqual([{ ports: [{ port: 8000, protocol: 'TCP' }], from: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'ingress-nginx' } } }] }]);
    expect(await validateBuiltin(np)).toBeNull();
  });

  it('adds the configured peers', () => {
    const docs = renderOk(withDb('--set-json', 'networkPolicy.api.from=[{"namespaceSelector":{"matchLabels":{"team":"apps"}}},{"podSelector":{"matchLabels":{"app":"client"}}}]'));
    expect(apiPolicy(docs).spec.ingress[0].from).toEqual([
      { namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'ingress-nginx' } } },
      { namespaceSelector: { matchLabels: { team: 'apps' } } },
      { podSelector: { matchLabels: { app: 'client' } } },
    ]);
  });

  it('with no peer at all it admits nobody (a rule without `from` would admit everyone)', () => {
    const docs = renderOk(withDb('--set', 'networkPolicy.api.ingressControllerNamespaceSelector=null'));
    expect(apiPolicy(docs).spec.ingress).toEqual([]);
  });

  it('a peer that is not a NetworkPolicyPeer is refused by the values schema', () => {
    const r = render(withDb('--set-json', 'networkPolicy.api.from=[{"cidr":"10.0.0.0/8"}]'));
    expect(r.code).not.toBe(0);
  });

  it('off with networkPolicy.api.enabled=false or networkPolicy.enabled=false', () => {
    expect(byKind(renderOk(withDb('--set', 'networkPolicy.api.enabled=false')), 'NetworkPolicy').map((n) => n.metadata.name)).not.toContain('sandpod-api');
    expect(byKind(renderOk(withDb('--set', 'networkPolicy.enabled=false')), 'NetworkPolicy')).toEqual([]);
  });
});

describeRendered('ServiceMonitor', () => {
  it('is rendered only when the cluster serves the kind', () => {
    expect(byKind(renderOk(withDb()), 'ServiceMonitor')).toEqual([]);
    expect(byKind(renderOk(withDb(...SM_API, '--set', 'serviceMonitor.enabled=false')), 'ServiceMonitor')).toEqual([]);
  });

  it('selects the Service, scrapes /metrics on its port with the API token', () => {
    const docs = renderOk(withDb(...SM_API, '--set', 'serviceMonitor.labels.release=prom'));
    const sm = one(docs, 'ServiceMonitor');
    expect(sm.apiVersion).toBe('monitoring.coreos.com/v1');
    expect(sm.metadata.labels.release).toBe('prom');
    const svc = one(docs, 'Service', 'sandpod');
    for (const [k, v] of Object.entries(sm.spec.selector.matchLabels)) expect(svc.metadata.labels[k]).toBe(v);
    expect(sm.spec.namespaceSelector).toEqual({ matchNames: ['sandpod'] });
    const ep = sm.spec.endpoints[0];
    expect(svc.spec.ports.map((p: Manifest) => p.name)).toContain(ep.port);
    expect(ep).toMatchObject({ path: '/metrics', interval: '30s', bearerTokenSecret: { name: 'sandpod-api-tokens', key: 'tokens' } });
    const open = one(renderOk(withDb(...SM_API, '--set', 'auth.enabled=false')), 'ServiceMonitor');
    expect(open.spec.endpoints[0].bearerTokenSecret).toBeUndefined();
  });
});

describeRendered('NOTES.txt', () => {
  const notes = (...args: string[]) => {
    const r = render(withDb('--notes', ...args));
    expect(r.code).toBe(0);
    return r.stderr;
  };

  it.skipIf(!RENDERER?.notes)('says how to get the token and sends it in the example; port-forward without an ingress', () => {
    const n = notes();
    expect(n).toContain("kubectl -n sandpod get secret sandpod-api-tokens -o jsonpath='{.data.tokens}' | base64 -d");
    expect(n).toContain('curl -s http://localhost:8000/execute -H "authorization: Bearer $SANDPOD_TOKEN"');
    expect(n).toContain('port-forward svc/sandpod 8000:8000');
    expect(n).toContain('-l sandpod.io/execution-id=<execution id>');
    expect(n).not.toContain('OPEN');
  });

  it.skipIf(!RENDERER?.notes)('shows the ingress URL (https with TLS) instead of a port-forward', () => {
    const n = notes('--set', 'ingress.enabled=true', '--set', 'ingress.hosts[0].host=runs.example.org', '--set', 'ingress.hosts[0].paths[0].path=/', '--set', 'ingress.hosts[0].paths[0].pathType=Prefix', '--set', 'ingress.tls[0].secretName=t', '--set', 'ingress.tls[0].hosts[0]=runs.example.org');
    expect(n).toContain('The API: https://runs.example.org');
    expect(n).toContain('curl -s https://runs.example.org/execute');
    expect(n).not.toContain('port-forward');
  });

  it.skipIf(!RENDERER?.notes)('warns loudly when auth is off', () => {
    const n = notes('--set', 'auth.enabled=false');
    expect(n).toMatch(/WARNING: .*the API is OPEN/);
    expect(n).not.toContain('SANDPOD_TOKEN');
  });

  it.skipIf(!RENDERER?.notes)('mentions the ServiceMonitor only when one is rendered', () => {
    expect(notes()).not.toContain('ServiceMonitor');
    expect(notes(...SM_API)).toContain('ServiceMonitor sandpod');
  });
});

