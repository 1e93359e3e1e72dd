/**
 * Job-type builds in the chart: `builds.*` values become the service's kubernetes.build_* config,
 * the RBAC to read exactly the registry Secret, and an egress NetworkPolicy for build pods; the
 * build Job itself passes Pod Security `restricted` like run pods.
 */
import YAML from 'yaml';
import { beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.ts';
import { buildEnvJob } from '../../../src/runtime/kubernetes/builds/build-env-job.ts';
import { DB_URL, TOOL_BUILD_TIMEOUT_MS, byKind, describeRendered, one, prepareRenderer, renderOk, restrictedViolations, withDb, type Manifest } from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const ON = [
  '--set', 'builds.registry=registry.example.com/sandpod/builds',
  '--set', 'builds.registrySecret=push-creds',
  '--set', 'builds.allowedCIDRs[0]=10.20.0.0/16',
  '--set', 'builds.ports[0].port=443',
];

function config(docs: Manifest[]) {
  return parseConfig(YAML.parse(one(docs, 'ConfigMap').data['config.yaml']), { SVC_DATABASE_URL: DB_URL });
}

describeRendered('chart: job-type builds', () => {
  it('off by default: no build registry, no Secret access, no build egress', () => {
    const docs = renderOk(withDb());
    expect(config(docs).kubernetes.build_registry).toBeNull();
    const role = one(docs, 'Role', 'sandpod-jobtypes');
    expect(role.rules.some((r: Manifest) => r.resources.includes('secrets'))).toBe(false);
    expect(byKind(docs, 'NetworkPolicy').map((p) => p.metadata.name)).not.toContain('sandpod-builds-egress');
  });

  it('builds.* become kubernetes.build_*; the Role reads only the named Secret; build pods get egress to the index', () => {
    const docs = renderOk(withDb(...ON));
    const k = config(docs).kubernetes;
    expect(k).toMatchObject({ build_registry: 'registry.example.com/sandpod/builds', build_registry_secret: 'push-creds', build_registry_insecure: false, build_platform: 'linux/amd64', build_cpu: '1', build_memory: '2Gi', build_ephemeral_storage: '4Gi' });
    const role = one(docs, 'Role', 'sandpod-jobtypes');
    expect(role.rules).toContainEqual({ apiGroups: [''], resources: ['secrets'], resourceNames: ['push-creds'], verbs: ['get'] });
    expect(role.rules).toContainEqual({ apiGroups: ['sandpod.io'], resources: ['jobtypes/status'], verbs: ['get', 'patch', 'update'] });
    const np = one(docs, 'NetworkPolicy', 'sandpod-builds-egress');
    expect(np.metadata.namespace).toBe('sandpod-jobs');
    expect(np.spec.podSelector.matchLabels).toEqual({ 'app.kubernetes.io/managed-by': 'sandpod', 'sandpod.io/instance': 'sandpod', 'sandpod.io/network': 'build' });
    expect(np.spec.egress[1]).toEqual({ to: [{ ipBlock: { cidr: '10.20.0.0/16' } }], ports: [{ protocol: 'TCP', port: 443 }] });

    // The Job the service will create from that config: restricted, like run pods.
    const job = buildEnvJob({ jobType: 'data', buildKey: 'k', image: 'registry.example.com/sandpod/executor@sha256:' + 'a'.repeat(64), requirements: ['numpy'], runtimeClassName: 'gvisor', deadlineSeconds: 60 }, config(docs));
    expect(restrictedViolations(job.spec!.template.spec as Manifest)).toEqual([]);
    expect(job.spec!.template.metadata!.labels!['sandpod.io/network']).toBe('build');
  });

  it('values.schema.json refuses a bad registry', () => {
    expect(() => renderOk(withDb('--set', 'builds.registry=https://registry.example.com'))).toThrow();
  });
});
