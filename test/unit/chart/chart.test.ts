/**
 * The Helm chart renders what a cluster install needs, with the labels, RBAC, NetworkPolicies and
 * security settings the Kubernetes runtime relies on.
 */
import { lstatSync, readFileSync, readlinkSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { LABELS, MANAGED_BY } from '../../../src/runtime/kubernetes/names.ts';
import {
  CHART_DIR,
  REPO_ROOT,
  RENDERER,
  TOOL_BUILD_TIMEOUT_MS,
  byKind,
  describeRendered,
  one,
  prepareRenderer,
  render,
  renderOk,
  restrictedViolations,
  validateBuiltin,
  withDb,
  type Manifest,
} from '../../support/chart.ts';

beforeAll(() => prepareRenderer(), TOOL_BUILD_TIMEOUT_MS);

const PKG = JSON.parse(readFileSync(path.join(REPO_ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };

describeRendered('default render', () => {
  let docs: Manifest[];
  beforeAll(() => {
    docs = renderOk(withDb());
  });

  it('contains the expected kinds', () => {
    const kinds = new Set(docs.map((d) => d.kind));
    for (const kind of [
      'Namespace',
      'NetworkPolicy',
      'PodDisruptionBudget',
      'ServiceAccount',
      'Secret',
      'ConfigMap',
      'ClusterRole',
      'ClusterRoleBinding',
      'Role',
      'RoleBinding',
      'Service',
      'Deployment',
      'Job',
      'JobType',
    ]) {
      expect(kinds, kind).toContain(kind);
    }
    // Off by default: clusters ship gVisor's RuntimeClass themselves; no Ingress unless asked.
    expect(kinds).not.toContain('RuntimeClass');
    expect(kinds).not.toContain('Ingress');
    // CRDs only with --include-crds.
    expect(kinds).not.toContain('CustomResourceDefinition');
  });

  it('the schema validator used below does reject bad objects', async () => {
    const dep = structuredClone(one(docs, 'Deployment', 'sandpod'));
    dep.spec.replicas = 'two';
    expect(await validateBuiltin(dep)).toMatch(/replicas/);
  });

  it('every built-in object is valid against the Kubernetes OpenAPI schema', async () => {
    for (const d of docs.filter((x) => x.kind !== 'JobType')) {
      expect(await validateBuiltin(d), `${d.kind} ${d.metadata?.name}`).toBeNull();
    }
  });

  it('labels every object with app.kubernetes.io/* and sandpod.io/instance', () => {
    for (const d of docs) {
      const labels = d.metadata?.labels ?? {};
      // The egress proxy's objects have their own name (the API's selectors must not pick its pods).
      expect(labels['app.kubernetes.io/name'], `${d.kind} ${d.metadata?.name}`).toBe(d.metadata?.name === 'sandpod-egress-proxy' || d.metadata?.name === 'sandpod-egress-key' ? 'sandpod-egress-proxy' : 'sandpod');
      expect(labels['app.kubernetes.io/instance']).toBe('sandpod');
      expect(labels['app.kubernetes.io/managed-by']).toBe('Helm');
      expect(labels['sandpod.io/instance']).toBe('sandpod');
    }
  });

  it('puts namespaced objects in the release namespace, or the runs namespace for run-side objects', () => {
    const runSide = new Set(['NetworkPolicy']);
    for (const d of docs) {
      if (['Namespace', 'ClusterRole', 'ClusterRoleBinding'].includes(d.kind)) {
        expect(d.metadata.namespace).toBeUndefined();
      } else if ((runSide.has(d.kind) && !['sandpod-api', 'sandpod-egress-proxy'].includes(d.metadata.name)) || (d.kind === 'Role' && d.metadata.name.endsWith('-runs'))) {
        expect(d.metadata.namespace, `${d.kind} ${d.metadata.name}`).toBe('sandpod-jobs');
      } else if (d.kind === 'RoleBinding') {
        expect(['sandpod', 'sandpod-jobs']).toContain(d.metadata.namespace);
      } else {
        expect(d.metadata.namespace, `${d.kind} ${d.metadata.name}`).toBe('sandpod');
      }
    }
  });

  it('creates the runs namespace labeled Pod Security restricted (enforce, audit, warn)', () => {
    const ns = one(docs, 'Namespace');
    expect(ns.metadata.name).toBe('sandpod-jobs');
    for (const mode of ['enforce', 'audit', 'warn']) {
      expect(ns.metadata.labels[`pod-security.kubernetes.io/${mode}`]).toBe('restricted');
    }
  });

  it('API pods are Pod Security restricted: non-root 1000, read-only root, /tmp an emptyDir', () => {
    const dep = one(docs, 'Deployment', 'sandpod');
    const pod = dep.spec.template.spec;
    expect(restrictedViolations(pod)).toEqual([]);
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000 });
    const api = pod.containers[0];
    expect(api.securityContext.readOnlyRootFilesystem).toBe(true);
    const tmp = api.volumeMounts.find((m: Manifest) => m.mountPath === '/tmp');
    expect(pod.volumes.find((v: Manifest) => v.name === tmp.name).emptyDir).toBeDefined();
    expect(pod.hostNetwork).toBeUndefined();
  });

  it('migration hook Job is restricted too and runs the compiled migrations (the package.json migrate script) before install and upgrade', () => {
    const job = one(docs, 'Job');
    expect(job.metadata.annotations['helm.sh/hook']).toBe('pre-install,pre-upgrade');
    const pod = job.spec.template.spec;
    expect(restrictedViolations(pod)).toEqual([]);
    expect(pod.containers[0].command).toEqual(['node', 'dist/store/migrate.js']);
    expect(pod.containers[0].command.join(' ')).toBe(PKG.scripts.migrate);
    expect(pod.automountServiceAccountToken).toBe(false);
    const env = Object.fromEntries(pod.containers[0].env.map((e: Manifest) => [e.name, e]));
    expect(env.SVC_DATABASE_URL.valueFrom.secretKeyRef).toEqual({ name: 'sandpod-database', key: 'url' });
    // The Secret it reads is a hook created before it (lower weight).
    const secret = one(docs, 'Secret', 'sandpod-database');
    expect(secret.metadata.annotations['helm.sh/hook']).toBe('pre-install,pre-upgrade');
    expect(Number(secret.metadata.annotations['helm.sh/hook-weight'])).toBeLessThan(
      Number(job.metadata.annotations['helm.sh/hook-weight']),
    );
    expect(Buffer.from(secret.data.url, 'base64').toString()).toMatch(/^postgres:\/\//);
  });

  it('API container gets SVC_CONFIG from the ConfigMap and SVC_DATABASE_URL from the Secret', () => {
    const dep = one(docs, 'Deployment', 'sandpod');
    const c = dep.spec.template.spec.containers[0];
    const env = Object.fromEntries(c.env.map((e: Manifest) => [e.name, e]));
    expect(env.SVC_CONFIG.value).toBe('/etc/sandpod/config.yaml');
    expect(env.SVC_DATABASE_URL.valueFrom.secretKeyRef).toEqual({ name: 'sandpod-database', key: 'url' });
    const mount = c.volumeMounts.find((m: Manifest) => m.mountPath === '/etc/sandpod');
    const vol = dep.spec.template.spec.volumes.find((v: Manifest) => v.name === mount.name);
    expect(vol.configMap.name).toBe(one(docs, 'ConfigMap').metadata.name);
    expect(dep.spec.template.metadata.annotations['checksum/config']).toMatch(/^[a-f0-9]{64}$/);
  });

  it('API container runs the compiled service (the package.json start script, the image CMD)', () => {
    const c = one(docs, 'Deployment', 'sandpod').spec.template.spec.containers[0];
    expect(c.command).toEqual(['node', 'dist/main.js']);
    expect(c.command.join(' ')).toBe(PKG.scripts.start);
  });

  it('probes: liveness never depends on /health (the breaker), readiness is separate', () => {
    const c = one(docs, 'Deployment', 'sandpod').spec.template.spec.containers[0];
    expect(c.livenessProbe.httpGet).toEqual({ path: '/livez', port: 'http' });
    expect(c.readinessProbe.httpGet).toEqual({ path: '/readyz', port: 'http' });
    expect(c.startupProbe.httpGet.path).toBe('/livez');
    // Nothing is compiled at start (dist/ is JavaScript): 30 s covers connecting to the database and
    // the Kubernetes API; the 120 s that compiling TypeScript at start needed is gone.
    expect(c.startupProbe.periodSeconds * c.startupProbe.failureThreshold).toBe(30);
    expect(c.ports).toEqual([{ name: 'http', containerPort: 8000, protocol: 'TCP' }]);
  });

  it('gives the pod more grace than the preStop pause and the drain take', () => {
    const pod = one(docs, 'Deployment', 'sandpod').spec.template.spec;
    // preStopSleepSeconds 5 + shutdown_grace_seconds 30 + 15 (test/unit/chart/isolation.test.ts has the hook).
    expect(pod.terminationGracePeriodSeconds).toBe(50);
    const custom = one(renderOk(withDb('--set', 'config.shutdown_grace_seconds=0', '--set', 'preStopSleepSeconds=0')), 'Deployment', 'sandpod');
    expect(custom.spec.template.spec.terminationGracePeriodSeconds).toBe(15);
  });

  it('Service listens on 8000', () => {
    const svc = one(docs, 'Service', 'sandpod');
    expect(svc.spec.ports).toEqual([{ name: 'http', port: 8000, targetPort: 'http', protocol: 'TCP' }]);
    expect(svc.spec.selector).toEqual(one(docs, 'Deployment', 'sandpod').spec.selector.matchLabels);
  });

  it('PodDisruptionBudget selects the API pods', () => {
    const pdb = one(docs, 'PodDisruptionBudget');
    expect(pdb.spec.selector.matchLabels).toEqual(one(docs, 'Deployment', 'sandpod').spec.selector.matchLabels);
  });

  it('renders the three built-in JobTypes', () => {
    expect(byKind(docs, 'JobType').map((j) => j.metadata.name).sort()).toEqual(['data', 'default', 'http']);
  });
});

describe('the restricted checker used here', () => {
  it('finds what Pod Security restricted refuses', () => {
    const bad = {
      hostNetwork: true,
      volumes: [{ name: 'h', hostPath: { path: '/' } }],
      containers: [{ name: 'c', securityContext: { runAsUser: 0, capabilities: { add: ['SYS_ADMIN'] } } }],
    };
    expect(restrictedViolations(bad)).toEqual([
      'host namespaces',
      'volume h: type hostPath',
      'container c: allowPrivilegeEscalation must be false',
      'container c: capabilities must drop ALL',
      'container c: adds capabilities SYS_ADMIN',
      'container c: runAsNonRoot must be true',
      'container c: runAsUser 0',
      'container c: seccompProfile undefined',
    ]);
  });
});

describeRendered('database', () => {
  it('fails without a database, saying what to set', () => {
    const r = render();
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('sandpod needs PostgreSQL in a cluster');
    expect(r.stderr).toContain('database.url');
    expect(r.stderr).toContain('database.existingSecret');
  });

  it('uses an existing Secret and renders none of its own', () => {
    const docs = renderOk(['--set', 'database.existingSecret=pg-creds', '--set', 'database.existingSecretKey=uri']);
    // The API tokens and the egress proxy key are the only Secrets the chart renders then.
    expect(byKind(docs, 'Secret').map((s) => s.metadata.name).sort()).toEqual(['sandpod-api-tokens', 'sandpod-egress-key']);
    for (const pod of [one(docs, 'Deployment', 'sandpod'), one(docs, 'Job')].map((o) => o.spec.template.spec)) {
      const env = pod.containers[0].env.find((e: Manifest) => e.name === 'SVC_DATABASE_URL');
      expect(env.valueFrom.secretKeyRef).toEqual({ name: 'pg-creds', key: 'uri' });
    }
  });

  it('migrations can be turned off', () => {
    const docs = renderOk(withDb('--set', 'migrations.enabled=false'));
    expect(byKind(docs, 'Job')).toEqual([]);
  });
});

describeRendered('CRDs', () => {
  it('charts/sandpod/crds is a symlink to the top-level crds/ (one source of truth)', () => {
    const link = path.join(CHART_DIR, 'crds');
    expect(lstatSync(link).isSymbolicLink()).toBe(true);
    expect(readlinkSync(link)).toBe('../../crds');
    expect(realpathSync(link)).toBe(realpathSync(path.join(REPO_ROOT, 'crds')));
  });

  it('--include-crds puts the JobType CRD first', () => {
    const docs = renderOk(withDb('--include-crds'));
    expect(docs[0]!.kind).toBe('CustomResourceDefinition');
    expect(docs[0]!.metadata.name).toBe('jobtypes.sandpod.io');
    expect(byKind(docs, 'CustomResourceDefinition')).toHaveLength(1);
  });
});

describeRendered('NetworkPolicies', () => {
  const cidrs = [
    '--set-json',
    'networkPolicy.bridge.allowedCIDRs=["203.0.113.0/24",{"cidr":"0.0.0.0/0","except":["10.0.0.0/8","169.254.0.0/16"]}]',
    '--set-json',
    'networkPolicy.bridge.ports=[{"port":443}]',
  ];

  it('default-deny selects every sandpod run pod, ingress and egress, allowing nothing', () => {
    const np = one(renderOk(withDb()), 'NetworkPolicy', 'sandpod-runs-default-deny');
    expect(np.metadata.namespace).toBe('sandpod-jobs');
    expect(np.spec.podSelector).toEqual({ matchLabels: { [LABELS.managedBy]: MANAGED_BY } });
    expect(np.spec.policyTypes).toEqual(['Ingress', 'Egress']);
    expect(np.spec.ingress).toBeUndefined();
    expect(np.spec.egress).toBeUndefined();
  });

  it('bridge egress selects this release’s bridge pods and allows DNS only by default', () => {
    const np = one(renderOk(withDb()), 'NetworkPolicy', 'sandpod-runs-bridge-egress');
    expect(np.spec.podSelector).toEqual({
      matchLabels: { [LABELS.managedBy]: MANAGED_BY, [LABELS.instance]: 'sandpod', [LABELS.network]: 'bridge' },
      // Pods behind the egress proxy have their own policy.
      matchExpressions: [{ key: LABELS.egress, operator: 'DoesNotExist' }],
    });
    expect(np.spec.policyTypes).toEqual(['Egress']);
    expect(np.spec.egress).toHaveLength(1);
    expect(np.spec.egress[0].to).toEqual([
      {
        namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'kube-system' } },
        podSelector: { matchLabels: { 'k8s-app': 'kube-dns' } },
      },
    ]);
    expect(np.spec.egress[0].ports).toEqual([
      { protocol: 'UDP', port: 53 },
      { protocol: 'TCP', port: 53 },
    ]);
  });

  it('bridge egress adds the allowed CIDRs (strings or {cidr, except}) and ports', async () => {
    const np = one(renderOk(withDb(...cidrs)), 'NetworkPolicy', 'sandpod-runs-bridge-egress');
    expect(np.spec.egress[1]).toEqual({
      to: [
        { ipBlock: { cidr: '203.0.113.0/24' } },
        { ipBlock: { cidr: '0.0.0.0/0', except: ['10.0.0.0/8', '169.254.0.0/16'] } },
      ],
      ports: [{ protocol: 'TCP', port: 443 }],
    });
    expect(await validateBuiltin(np)).toBeNull();
  });

  it('can be turned off', () => {
    expect(byKind(renderOk(withDb('--set', 'networkPolicy.enabled=false')), 'NetworkPolicy')).toEqual([]);
  });
});

describeRendered('RBAC', () => {
  const rules = (role: Manifest) =>
    Object.fromEntries(
      role.rules.flatMap((r: Manifest) =>
        r.resources.map((res: string) => [`${r.apiGroups.join(',') || 'core'}/${res}`, [...r.verbs].sort()]),
      ),
    );

  it('the runs Role grants exactly what the Kubernetes runtime needs, in the runs namespace', () => {
    const docs = renderOk(withDb());
    const role = one(docs, 'Role', 'sandpod-runs');
    expect(role.metadata.namespace).toBe('sandpod-jobs');
    expect(rules(role)).toEqual({
      // patch: a warm-pool claim (a JSON patch with the read resourceVersion as precondition), and the claimed pod's labels.
      'batch/jobs': ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'],
      'core/pods': ['delete', 'get', 'list', 'patch', 'watch'],
      // create: SPDY exec/attach (POST); get: WebSocket (GET) on clusters before 1.35's gate.
      'core/pods/attach': ['create', 'get'],
      'core/pods/exec': ['create', 'get'],
      'core/pods/log': ['get'],
      // Never get/list/watch: the service does not read Secrets of the runs namespace
      // (test/integration/kubernetes/secrets-access.test.ts).
      'core/secrets': ['create', 'delete'],
      // The runner sources pool pods mount (runs/runner-sources.ts): made, and the unused removed.
      'core/configmaps': ['create', 'delete', 'list'],
    });
    const binding = one(docs, 'RoleBinding', 'sandpod-runs');
    expect(binding.metadata.namespace).toBe('sandpod-jobs');
    expect(binding.roleRef).toEqual({ apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'sandpod-runs' });
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: 'sandpod', namespace: 'sandpod' }]);
    expect(one(docs, 'Deployment', 'sandpod').spec.template.spec.serviceAccountName).toBe('sandpod');
  });

  it('JobTypes are read (and their status written) in the release namespace only', () => {
    const docs = renderOk(withDb());
    const role = one(docs, 'Role', 'sandpod-jobtypes');
    expect(role.metadata.namespace).toBe('sandpod');
    expect(rules(role)).toEqual({
      'sandpod.io/jobtypes': ['get', 'list', 'watch'],
      'sandpod.io/jobtypes/status': ['get', 'patch', 'update'],
      // The network check: only this release's own Service (resourceNames; test/unit/chart/isolation.test.ts).
      'core/services': ['get'],
      // Leader election: create (any name), then get/update of the one Lease (both rules in leader-election.test.ts).
      'coordination.k8s.io/leases': ['get', 'update'],
    });
  });

  it('RuntimeClasses are read through a ClusterRole guarded by a value', () => {
    const docs = renderOk(withDb());
    const cr = one(docs, 'ClusterRole');
    expect(rules(cr)).toEqual({ 'node.k8s.io/runtimeclasses': ['get', 'list', 'watch'] });
    const crb = one(docs, 'ClusterRoleBinding');
    expect(crb.roleRef.name).toBe(cr.metadata.name);
    const off = renderOk(withDb('--set', 'rbac.clusterRole.create=false'));
    expect(byKind(off, 'ClusterRole')).toEqual([]);
    expect(byKind(off, 'ClusterRoleBinding')).toEqual([]);
    expect(byKind(off, 'Role')).toHaveLength(2);
  });
});

describeRendered('options', () => {
  it('Ingress with class, TLS and the proxy annotations (2 MB bodies, 300 s reads)', async () => {
    const docs = renderOk(
      withDb(
        '--set',
        'ingress.enabled=true',
        '--set',
        'ingress.className=nginx',
        '--set-json',
        'ingress.hosts=[{"host":"sandpod.example.com","paths":[{"path":"/","pathType":"Prefix"}]}]',
        '--set-json',
        'ingress.tls=[{"secretName":"sandpod-tls","hosts":["sandpod.example.com"]}]',
      ),
    );
    const ing = one(docs, 'Ingress');
    expect(await validateBuiltin(ing)).toBeNull();
    expect(ing.spec.ingressClassName).toBe('nginx');
    expect(ing.spec.tls).toEqual([{ secretName: 'sandpod-tls', hosts: ['sandpod.example.com'] }]);
    expect(ing.spec.rules[0].http.paths[0].backend.service).toEqual({ name: 'sandpod', port: { name: 'http' } });
    expect(ing.metadata.annotations['nginx.ingress.kubernetes.io/proxy-body-size']).toBe('2m');
    expect(ing.metadata.annotations['nginx.ingress.kubernetes.io/proxy-read-timeout']).toBe('300');
  });

  it('RuntimeClass gvisor with handler runsc when asked', async () => {
    const rc = one(renderOk(withDb('--set', 'runtimeClass.create=true')), 'RuntimeClass');
    expect(rc.metadata.name).toBe('gvisor');
    expect(rc.handler).toBe('runsc');
    expect(await validateBuiltin(rc)).toBeNull();
  });

  it('no PodDisruptionBudget with a single replica', () => {
    expect(byKind(renderOk(withDb('--set', 'replicaCount=1')), 'PodDisruptionBudget')).toEqual([]);
  });

  it('an existing runs namespace is not created; the same namespace as the release is refused', () => {
    expect(byKind(renderOk(withDb('--set', 'runs.createNamespace=false')), 'Namespace')).toEqual([]);
    const r = render(withDb('--set', 'runs.namespace=sandpod'));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('runs.namespace equals the release namespace');
  });

  it('refuses enable_seccomp=false with a restricted runs namespace (run pods would be rejected)', () => {
    const r = render(withDb('--set', 'config.enable_seccomp=false'));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('config.enable_seccomp=false leaves run pods without a seccomp profile');
    expect(render(withDb('--set', 'config.enable_seccomp=false', '--set', 'runs.podSecurity.level=baseline')).code).toBe(0);
  });

  it('images: tag defaults to appVersion, a digest wins', () => {
    const digest = `sha256:${'a'.repeat(64)}`;
    const docs = renderOk(withDb('--set', `image.digest=${digest}`, '--set', 'executorImage.tag=9.9.9'));
    expect(one(docs, 'Deployment', 'sandpod').spec.template.spec.containers[0].image).toBe(`ghcr.io/sandpod/sandpod@${digest}`);
    expect(one(renderOk(withDb()), 'Deployment', 'sandpod').spec.template.spec.containers[0].image).toBe(
      'ghcr.io/sandpod/sandpod:0.1.0',
    );
  });

  it.skipIf(!RENDERER?.notes)('NOTES.txt renders (chart-render only: `helm template` prints no notes)', () => {
    const r = render(withDb('--notes'));
    expect(r.code).toBe(0);
    expect(r.stderr).toContain('kubectl get jobs,pods -n sandpod-jobs -l sandpod.io/instance=sandpod');
    expect(r.stderr).toContain('kubectl apply -f crds/');
  });
});

describeRendered('PodDisruptionBudget API version', () => {
  it.each([
    ['1.20', 'policy/v1beta1'],
    ['1.21', 'policy/v1'],
    ['1.30', 'policy/v1'],
  ])('Kubernetes %s gets %s', (kube, api) => {
    const pdb = one(renderOk(withDb('--kube-version', kube, '--set', 'replicaCount=2')), 'PodDisruptionBudget');
    expect(pdb.apiVersion).toBe(api);
    expect(pdb.spec.minAvailable).toBeDefined();
  });
});
