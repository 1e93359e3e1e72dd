/**
 * The trial database (issue #13 point 4): `postgresql.enabled=true` deploys a single PostgreSQL
 * (StatefulSet, PVC, generated password) the service reaches without cluster DNS, marked not for
 * production; the migration hook gives way to the service's own migration at start.
 */
import { beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.ts';
import { TOOL_BUILD_TIMEOUT_MS, RENDERER, byKind, describeRendered, one, prepareRenderer, render, renderOk, restrictedViolations, validateBuiltin, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const TRIAL = ['--set', 'postgresql.enabled=true'];

describeRendered('trial database', () => {
  let docs: Manifest[];
  beforeAll(() => {
    docs = renderOk(TRIAL);
  });

  it('renders without a database URL: a StatefulSet with a claim, its Service and a generated password', async () => {
    const sts = one(docs, 'StatefulSet', 'sandpod-postgresql');
    expect(sts.spec.replicas).toBe(1);
    expect(sts.spec.volumeClaimTemplates[0].spec.resources.requests.storage).toBe('8Gi');
    expect(sts.spec.template.spec.containers[0].image).toBe('docker.io/library/postgres:16');
    const svc = one(docs, 'Service', 'sandpod-postgresql');
    for (const [k, v] of Object.entries(svc.spec.selector)) expect(sts.spec.template.metadata.labels[k]).toBe(v);
    expect(svc.spec.ports[0].port).toBe(5432);
    const secret = one(docs, 'Secret', 'sandpod-postgresql');
    expect(Buffer.from(secret.data.password, 'base64').toString()).toMatch(/^[A-Za-z0-9]{32}$/);
    expect(secret.metadata.annotations['helm.sh/resource-policy']).toBe('keep');
    for (const d of [sts, svc, secret]) expect(await validateBuiltin(d)).toBeNull();
  });

  it('its pod passes Pod Security restricted (uid 999, read-only root, no privileges)', () => {
    const pod = one(docs, 'StatefulSet').spec.template.spec;
    expect(restrictedViolations(pod)).toEqual([]);
    expect(pod.securityContext).toMatchObject({ runAsUser: 999, fsGroup: 999, runAsNonRoot: true });
  });

  it('the service gets its URL from the password and the Service link variables (no DNS), and parses it', () => {
    const dep = one(docs, 'Deployment', 'sandpod').spec.template.spec;
    expect(dep.enableServiceLinks).toBe(true);
    const env = dep.containers[0].env as Manifest[];
    const pw = env.findIndex((e) => e.name === 'TRIAL_DATABASE_PASSWORD');
    const url = env.findIndex((e) => e.name === 'SVC_DATABASE_URL');
    // $(VAR) only expands variables defined before it.
    expect(pw).toBeGreaterThanOrEqual(0);
    expect(url).toBeGreaterThan(pw);
    expect(env[pw]!.valueFrom.secretKeyRef).toEqual({ name: 'sandpod-postgresql', key: 'password' });
    expect(env[url]!.value).toBe('postgres://postgres:$(TRIAL_DATABASE_PASSWORD)@$(SANDPOD_POSTGRESQL_SERVICE_HOST):$(SANDPOD_POSTGRESQL_SERVICE_PORT)/postgres');
    // What the kubelet would make of it is a URL the service takes.
    const expanded = env[url]!.value.replace('$(TRIAL_DATABASE_PASSWORD)', 'Abc123').replace('$(SANDPOD_POSTGRESQL_SERVICE_HOST)', '10.96.0.42').replace('$(SANDPOD_POSTGRESQL_SERVICE_PORT)', '5432');
    expect(parseConfig({}, { SVC_DATABASE_URL: expanded }).database_url).toBe('postgres://postgres:Abc123@10.96.0.42:5432/postgres');
  });

  it('no migration hook and no database Secret (the service migrates at start)', () => {
    expect(byKind(docs, 'Job')).toEqual([]);
    expect(byKind(docs, 'Secret').map((s) => s.metadata.name).sort()).toEqual(['sandpod-api-tokens', 'sandpod-egress-key', 'sandpod-postgresql']);
  });

  it('without persistence the data volume is an emptyDir and there is no claim', () => {
    const sts = one(renderOk([...TRIAL, '--set', 'postgresql.persistence.enabled=false']), 'StatefulSet');
    expect(sts.spec.volumeClaimTemplates).toBeUndefined();
    expect(sts.spec.template.spec.volumes.find((v: Manifest) => v.name === 'data')).toEqual({ name: 'data', emptyDir: {} });
  });

  it('refuses a database URL or Secret next to it, naming both', () => {
    for (const extra of [['--set', 'database.url=postgres://x@db/s'], ['--set', 'database.existingSecret=pg']]) {
      const r = render([...TRIAL, ...extra]);
      expect(r.code).not.toBe(0);
      expect(r.stderr).toContain('postgresql.enabled=true deploys a trial database');
    }
  });

  it('off by default: no trial objects, and no database at all still fails with a message naming the trial option', () => {
    const r = render([]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain('postgresql.enabled=true for a trial database');
  });

  it.skipIf(!RENDERER?.notes)('NOTES say it is not for production', () => {
    const r = render([...TRIAL, '--notes']);
    expect(r.stderr).toMatch(/WARNING: the trial PostgreSQL \(sandpod-postgresql\) is NOT FOR PRODUCTION/);
  });
});
