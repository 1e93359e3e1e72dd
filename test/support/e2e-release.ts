/**
 * A release of the chart on a real cluster for the e2e suites, installed as `helm install` does:
 * CRDs, the pre-install hooks (database Secret, migration Job), then the release; with its own
 * namespaces and database, all removed by `uninstall()`. Needs SANDPOD_E2E_KUBECONFIG,
 * _SERVICE_IMAGE, _IMAGE, _DATABASE_URL and _DATABASE_ADMIN_URL (see chart.test.ts).
 */
import { randomUUID } from 'node:crypto';
import { readdirSync } from 'node:fs';
import { AppsV1Api, BatchV1Api, CoordinationV1Api, CoreV1Api, KubeConfig, RbacAuthorizationV1Api, VersionApi, type KubernetesObject } from '@kubernetes/client-node';
import pg from 'pg';
import { prepareRenderer, render, type Manifest } from './chart.ts';
import { applyObjects, manifestObjects } from './kube-apply.ts';

export const E2E = {
  kubeconfig: process.env.SANDPOD_E2E_KUBECONFIG,
  serviceImage: process.env.SANDPOD_E2E_SERVICE_IMAGE,
  executorImage: process.env.SANDPOD_E2E_IMAGE,
  dbUrl: process.env.SANDPOD_E2E_DATABASE_URL,
  dbAdminUrl: process.env.SANDPOD_E2E_DATABASE_ADMIN_URL,
  gvisor: process.env.SANDPOD_E2E_GVISOR === '1',
};
/** Whether a release can be installed here. */
export const RELEASE_READY = !!(E2E.kubeconfig && E2E.serviceImage && E2E.executorImage && E2E.dbUrl && E2E.dbAdminUrl);

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * `repo@sha256:…` or `repo:tag` as the chart's image values. A tag gets pullPolicy IfNotPresent: the
 * chart pulls tags Always, and an image imported into the node (`kcluster image`) is in no registry.
 */
export function imageValues(prefix: string, ref: string): string[] {
  const at = ref.indexOf('@');
  if (at > 0) return ['--set', `${prefix}.repository=${ref.slice(0, at)}`, '--set', `${prefix}.digest=${ref.slice(at + 1)}`];
  const colon = ref.lastIndexOf(':');
  return ['--set', `${prefix}.repository=${ref.slice(0, colon)}`, '--set-string', `${prefix}.tag=${ref.slice(colon + 1)}`, '--set', `${prefix}.pullPolicy=IfNotPresent`];
}

export class E2ERelease {
  readonly suffix = randomUUID().slice(0, 6);
  readonly release: string;
  readonly ns: string;
  readonly runsNs: string;
  readonly dbName: string;
  readonly kc = new KubeConfig();
  readonly core: CoreV1Api;
  readonly apps: AppsV1Api;
  readonly batch: BatchV1Api;
  readonly coordination: CoordinationV1Api;
  values: string[] = [];
  base = '';
  token = '';
  private readonly clusterScoped: Manifest[] = [];

  constructor(prefix: string) {
    this.release = `${prefix}-${this.suffix}`;
    this.ns = `sandpod-${prefix}-${this.suffix}`;
    this.runsNs = `${this.ns}-jobs`;
    this.dbName = `sandpod_${prefix}_${this.suffix}`;
    this.kc.loadFromFile(E2E.kubeconfig!);
    this.core = this.kc.makeApiClient(CoreV1Api);
    this.apps = this.kc.makeApiClient(AppsV1Api);
    this.batch = this.kc.makeApiClient(BatchV1Api);
    this.coordination = this.kc.makeApiClient(CoordinationV1Api);
  }

  get deployment(): string {
    return `${this.release}-sandpod`;
  }

  renderRelease(extra: string[], only: string[] = []): Manifest[] {
    const r = render([...this.values, ...extra, ...only.flatMap((t) => ['-s', t])], { release: this.release, namespace: this.ns });
    if (r.code !== 0) throw new Error(`render failed:\n${r.stderr}`);
    return r.docs;
  }

  apply(docs: Manifest[]): Promise<void> {
    return applyObjects(this.kc, docs as KubernetesObject[], (o) => o.kind === 'Secret' && o.metadata?.name === `${this.release}-sandpod-api-tokens`);
  }

  /** Installs with the common values plus `extra`; resolves once the Deployment rolled out. */
  async install(extra: string[]): Promise<Manifest[]> {
    prepareRenderer();
    const admin = new pg.Client({ connectionString: E2E.dbAdminUrl });
    await admin.connect();
    await admin.query(`CREATE DATABASE ${this.dbName}`);
    await admin.end();
    const version = await this.kc.makeApiClient(VersionApi).getCode();
    this.values = [
      '--kube-version', `${version.major}.${Number.parseInt(version.minor, 10)}`,
      '--set', `database.url=${E2E.dbUrl!.replace(/\/$/, '')}/${this.dbName}`,
      ...imageValues('image', E2E.serviceImage!),
      ...imageValues('executorImage', E2E.executorImage!),
      // Under real gVisor (kcluster up --gvisor) the run pods must get its RuntimeClass: strict.
      '--set', `config.security_mode=${E2E.gvisor ? 'strict' : 'permissive'}`,
      '--set', `runs.namespace=${this.runsNs}`,
      ...extra,
    ];
    await this.core.createNamespace({ body: { metadata: { name: this.ns } } });
    const crds = new URL('../../crds/', import.meta.url);
    await applyObjects(this.kc, manifestObjects(readdirSync(crds).filter((f) => f.endsWith('.yaml')).map((f) => new URL(f, crds))));
    await this.apply(this.renderRelease([], ['templates/secret-database.yaml', 'templates/migration-job.yaml']));
    for (let i = 0; ; i++) {
      const job = await this.batch.readNamespacedJob({ name: `${this.release}-sandpod-migrate`, namespace: this.ns });
      if ((job.status?.succeeded ?? 0) > 0) break;
      if ((job.status?.failed ?? 0) > 0 || i > 180) throw new Error(`migration Job failed: ${JSON.stringify(job.status)}`);
      await sleep(1000);
    }
    const docs = this.renderRelease(['--no-hooks']);
    this.clusterScoped.push(...docs.filter((d) => ['ClusterRole', 'ClusterRoleBinding', 'Namespace'].includes(d.kind)));
    await this.apply(docs);
    await this.rolledOut();
    const svc = await this.core.readNamespacedService({ name: this.deployment, namespace: this.ns });
    this.base = `http://${svc.spec!.clusterIP}:${svc.spec!.ports![0]!.port}`;
    const secret = await this.core.readNamespacedSecret({ name: `${this.release}-sandpod-api-tokens`, namespace: this.ns });
    this.token = Buffer.from(secret.data!.tokens!, 'base64').toString().split('\n')[0]!;
    return docs;
  }

  /** Waits until the Deployment has all its replicas updated and ready. */
  async rolledOut(timeoutMs = 240_000): Promise<void> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const d = await this.apps.readNamespacedDeployment({ name: this.deployment, namespace: this.ns });
      const want = d.spec?.replicas ?? 1;
      const s = d.status ?? {};
      if ((s.observedGeneration ?? 0) >= (d.metadata?.generation ?? 0) && s.updatedReplicas === want && s.readyReplicas === want && (s.replicas ?? 0) === want) return;
      if (Date.now() > end) throw new Error(`deployment ${this.deployment} did not roll out: ${JSON.stringify(s)}`);
      await sleep(1000);
    }
  }

  /** A request to the release's Service (with the API token unless `auth: false`). */
  call(path: string, init: RequestInit & { auth?: boolean } = {}): Promise<Response> {
    const headers: Record<string, string> = { 'content-type': 'application/json', ...((init.headers as Record<string, string>) ?? {}) };
    if (init.auth !== false) headers.authorization = `Bearer ${this.token}`;
    return fetch(`${this.base}${path}`, { ...init, headers });
  }

  /** A query on the release's own database (from this machine). */
  async query<T extends pg.QueryResultRow>(sql: string, params: unknown[] = []): Promise<T[]> {
    const c = new pg.Client({ connectionString: `${E2E.dbAdminUrl!.replace(/\/[^/]*$/, '')}/${this.dbName}` });
    await c.connect();
    try {
      return (await c.query<T>(sql, params)).rows;
    } finally {
      await c.end();
    }
  }

  async uninstall(): Promise<void> {
    for (const ns of [this.ns, this.runsNs]) await this.core.deleteNamespace({ name: ns }).catch(() => undefined);
    const rbac = this.kc.makeApiClient(RbacAuthorizationV1Api);
    for (const d of this.clusterScoped) {
      if (d.kind === 'ClusterRole') await rbac.deleteClusterRole({ name: d.metadata.name }).catch(() => undefined);
      if (d.kind === 'ClusterRoleBinding') await rbac.deleteClusterRoleBinding({ name: d.metadata.name }).catch(() => undefined);
    }
    // Namespaces take their pods down first; the database goes once nothing holds it.
    for (let i = 0; i < 120; i++) {
      if (!(await this.core.readNamespace({ name: this.ns }).then(() => true, () => false))) break;
      await sleep(1000);
    }
    const admin = new pg.Client({ connectionString: E2E.dbAdminUrl });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${this.dbName} WITH (FORCE)`);
    await admin.end();
  }
}
