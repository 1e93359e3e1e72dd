/**
 * The chart's webhooks values (issue 21): off by default; on, the rendered SVC_CONFIG carries a
 * `webhooks` section the service parses, its secrets file comes from a generated Secret holding a
 * Standard Webhooks secret the service accepts (or from an existing Secret), mounted read-only.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import YAML from 'yaml';
import { beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.ts';
import { configuredSecrets } from '../../../src/webhooks/sign.ts';
import { DB_URL, TOOL_BUILD_TIMEOUT_MS, byKind, describeRendered, one, prepareRenderer, render, renderOk, withDb, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const POD_ENV = { SVC_DATABASE_URL: DB_URL, SVC_WORKSPACE: '/tmp/sandpod' };
const configOf = (docs: Manifest[]) => parseConfig(YAML.parse(one(docs, 'ConfigMap').data['config.yaml']) as unknown, POD_ENV);
const api = (docs: Manifest[]) => byKind(docs, 'Deployment').find((d) => d.metadata.name === 'sandpod')!;

describeRendered('chart webhooks', () => {
  it('are off by default: no section, no Secret, no mount', () => {
    const docs = renderOk(withDb());
    expect(configOf(docs).webhooks.allowed_hosts).toEqual([]);
    expect(byKind(docs, 'Secret').map((s) => s.metadata.name)).not.toContain('sandpod-webhook-secrets');
    expect(JSON.stringify(api(docs).spec.template.spec.volumes)).not.toContain('webhook');
  });

  it('on: the config the service parses, and a generated secret it accepts, mounted read-only', () => {
    const docs = renderOk(withDb('--set', 'webhooks.enabled=true', '--set-json', 'webhooks.allowedHosts=["hooks.example.com","*.svc.cluster.local:8080"]', '--set', 'webhooks.allowPrivateAddresses=true', '--set', 'webhooks.maxAttempts=5'));
    const w = configOf(docs).webhooks;
    expect(w).toMatchObject({
      allowed_hosts: ['hooks.example.com', '*.svc.cluster.local:8080'],
      allow_private_addresses: true,
      default_callback_url: null,
      max_attempts: 5,
      max_age_seconds: 3600,
      base_delay_seconds: 25,
      timeout_seconds: 10,
      secrets_file: '/etc/sandpod/webhooks/secrets',
    });
    const secret = one(docs, 'Secret', 'sandpod-webhook-secrets');
    expect(secret.metadata.annotations['helm.sh/resource-policy']).toBe('keep');
    const file = path.join(mkdtempSync(path.join(tmpdir(), 'chart-whsec-')), 'secrets');
    writeFileSync(file, Buffer.from(secret.data.secrets, 'base64'));
    expect(configuredSecrets({ secrets: [], secrets_file: file })).toEqual([expect.stringMatching(/^whsec_[A-Za-z0-9+/]{43}=$/)]);
    const pod = api(docs).spec.template.spec;
    // `defaultMode: 0440` as the API pods' other Secret volumes (an octal literal to Kubernetes).
    expect(pod.volumes).toContainEqual({ name: 'webhook-secrets', secret: { secretName: 'sandpod-webhook-secrets', defaultMode: expect.any(Number), items: [{ key: 'secrets', path: 'secrets' }] } });
    expect(pod.containers[0].volumeMounts).toContainEqual({ name: 'webhook-secrets', mountPath: '/etc/sandpod/webhooks', readOnly: true });
  });

  it('existingSecret: no generated Secret; the mount names it and its key', () => {
    const docs = renderOk(withDb('--set', 'webhooks.enabled=true', '--set-json', 'webhooks.allowedHosts=["hooks.example.com"]', '--set', 'webhooks.existingSecret=my-hooks', '--set', 'webhooks.existingSecretKey=current'));
    expect(byKind(docs, 'Secret').map((s) => s.metadata.name)).not.toContain('sandpod-webhook-secrets');
    expect(api(docs).spec.template.spec.volumes).toContainEqual({ name: 'webhook-secrets', secret: { secretName: 'my-hooks', defaultMode: expect.any(Number), items: [{ key: 'current', path: 'secrets' }] } });
  });

  it('the values schema refuses a default callback that is not an http(s) URL and an unknown key', () => {
    expect(render(withDb('--set', 'webhooks.defaultCallbackUrl=ftp://x')).code).not.toBe(0);
    expect(render(withDb('--set', 'webhooks.secrets=x')).code).not.toBe(0);
  });
});
