/**
 * Test helpers for the Helm chart: render it like `helm template`, parse the manifests, validate them
 * against the Kubernetes OpenAPI schemas, and check pod specs against Pod Security `restricted`.
 *
 * Rendering uses, in this order: `helm` when it is on PATH; the `chart-render` tool (`helm template`
 * without helm) when a `shared/` directory sits beside the repository, as in CI
 * (`<repo>/../shared/tools/chart-render/chart-render`); otherwise nothing, and the tests that render
 * skip themselves (wrap them in {@link describeRendered}) after saying why. chart-render builds
 * itself on first use (Go and a few Debian packages from apt, about 20 s plus apt time): call
 * {@link prepareRenderer} in a `beforeAll` with {@link TOOL_BUILD_TIMEOUT_MS}.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe } from 'vitest';
import YAML from 'yaml';

/** The repository root (this file is test/support/chart.ts). */
export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const CHART_DIR = path.join(REPO_ROOT, 'charts/sandpod');
export const CRD_FILE = path.join(REPO_ROOT, 'crds/jobtypes.sandpod.io.yaml');
const CHART_RENDER = path.resolve(REPO_ROOT, '../shared/tools/chart-render/chart-render');

/** apt install + cold Go build of chart-render on a 2-core machine, with room to spare. */
export const TOOL_BUILD_TIMEOUT_MS = 600_000;

/** A way to render the chart. */
export interface Renderer {
  name: 'helm' | 'chart-render';
  /** The executable and the arguments of one render (release, chart, namespace, extra flags). */
  command: string;
  argv(release: string, chart: string, namespace: string, args: string[]): string[];
  /** Prints NOTES.txt to stderr with `--notes` (chart-render only; `helm template` has no notes). */
  notes: boolean;
}

function findRenderer(): Renderer | null {
  if (!spawnSync('helm', ['version', '--short'], { encoding: 'utf8', timeout: 30_000 }).error) {
    return { name: 'helm', command: 'helm', argv: (r, c, n, a) => ['template', r, c, '-n', n, ...a], notes: false };
  }
  if (existsSync(CHART_RENDER)) {
    return { name: 'chart-render', command: CHART_RENDER, argv: (r, c, n, a) => [r, c, '-n', n, ...a], notes: true };
  }
  return null;
}

/** The renderer of this run, or null when there is none (tests that render are skipped). */
export const RENDERER: Renderer | null = findRenderer();

/** Why chart renders are skipped here (null when they run). */
export const NO_RENDERER: string | null = RENDERER
  ? null
  : `chart tests that render are skipped: no \`helm\` on PATH and no chart-render at ${CHART_RENDER} ` +
    '(install helm, or check the repository out beside the shared/ tools as CI does)';
let told = false;

/** `describe`, skipped (once saying why) when nothing here can render the chart. */
export function describeRendered(name: string, fn: () => void): void {
  if (NO_RENDERER && !told) {
    told = true;
    console.warn(NO_RENDERER);
  }
  describe.skipIf(RENDERER === null)(name, fn);
}

/** Makes the renderer ready (chart-render builds on first use; `--version` builds without rendering). */
export function prepareRenderer(): void {
  if (RENDERER?.name !== 'chart-render') return;
  const r = spawnSync(RENDERER.command, ['--version'], { encoding: 'utf8', timeout: TOOL_BUILD_TIMEOUT_MS });
  if (r.status !== 0) throw new Error(`chart-render --version failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
}

/** A database URL for renders that should succeed. */
export const DB_URL = 'postgres://sandpod:secret@postgres.db.svc:5432/sandpod';

/** A Kubernetes object as rendered (loosely typed on purpose: tests walk it). */
export type Manifest = Record<string, any>;

export interface RenderResult {
  code: number;
  stdout: string;
  stderr: string;
  docs: Manifest[];
}

/** helm's warning about `crds`, a symlink (intended: see charts/sandpod/README.md), is not an error. */
const HELM_SYMLINK_WARNING = /^walk\.go:\d+: found symbolic link in path: .*\n?/gm;

/**
 * Renders the chart as release `sandpod` in namespace `sandpod` (unless opts say otherwise).
 * `args` are extra `helm template` flags, e.g. `['--set', 'replicaCount=1']`.
 */
export function render(args: string[] = [], opts: { release?: string; namespace?: string } = {}): RenderResult {
  if (!RENDERER) throw new Error(NO_RENDERER!);
  const argv = RENDERER.argv(opts.release ?? 'sandpod', CHART_DIR, opts.namespace ?? 'sandpod', args);
  const r = spawnSync(RENDERER.command, argv, { encoding: 'utf8', timeout: 60_000 });
  const code = r.status ?? -1;
  const stderr = RENDERER.name === 'helm' ? r.stderr.replace(HELM_SYMLINK_WARNING, '') : r.stderr;
  const docs =
    code === 0
      ? YAML.parseAllDocuments(r.stdout)
          .map((d) => d.toJS() as Manifest | null)
          .filter((d): d is Manifest => d !== null)
      : [];
  return { code, stdout: r.stdout, stderr, docs };
}

/** Renders and fails the test with the tool's stderr when rendering fails. */
export function renderOk(args: string[] = [], opts: { release?: string; namespace?: string } = {}): Manifest[] {
  const r = render(args, opts);
  if (r.code !== 0) throw new Error(`${RENDERER?.name} failed (${r.code}):\n${r.stderr}`);
  return r.docs;
}

/** `--set database.url=...` plus extra args: the minimal valid install. */
export function withDb(...args: string[]): string[] {
  return ['--set', `database.url=${DB_URL}`, ...args];
}

export function byKind(docs: Manifest[], kind: string): Manifest[] {
  return docs.filter((d) => d.kind === kind);
}

export function one(docs: Manifest[], kind: string, name?: string): Manifest {
  const found = docs.filter((d) => d.kind === kind && (name === undefined || d.metadata?.name === name));
  if (found.length !== 1) {
    throw new Error(`expected one ${kind}${name ? ` ${name}` : ''}, found ${found.length}`);
  }
  return found[0]!;
}

/**
 * Validates a built-in object against the Kubernetes OpenAPI schema (kubernetes-models, k8s 1.27).
 * Returns null when valid, else the validator's message. Custom resources are not covered.
 */
export async function validateBuiltin(obj: Manifest): Promise<string | null> {
  const load = MODELS[String(obj.apiVersion)];
  if (!load) return `no model for apiVersion ${obj.apiVersion}`;
  const mod = (await load()) as unknown as Record<string, new (o: unknown) => { validate(): void }>;
  const Model = mod[String(obj.kind)];
  if (!Model) return `no model for ${obj.apiVersion} ${obj.kind}`;
  try {
    new Model(obj).validate();
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

/** The API groups the chart renders (static imports, so the bundler resolves them). */
const MODELS: Record<string, () => Promise<unknown>> = {
  v1: () => import('kubernetes-models/v1'),
  'apps/v1': () => import('kubernetes-models/apps/v1'),
  'batch/v1': () => import('kubernetes-models/batch/v1'),
  'policy/v1': () => import('kubernetes-models/policy/v1'),
  'networking.k8s.io/v1': () => import('kubernetes-models/networking.k8s.io/v1'),
  'rbac.authorization.k8s.io/v1': () => import('kubernetes-models/rbac.authorization.k8s.io/v1'),
  'node.k8s.io/v1': () => import('kubernetes-models/node.k8s.io/v1'),
  'apiextensions.k8s.io/v1': () => import('kubernetes-models/apiextensions.k8s.io/v1'),
};

const RESTRICTED_VOLUME_TYPES = new Set([
  'configMap',
  'csi',
  'downwardAPI',
  'emptyDir',
  'ephemeral',
  'persistentVolumeClaim',
  'projected',
  'secret',
]);

/**
 * Violations of Pod Security Standards `restricted` (latest) in a pod spec; empty when compliant.
 * Mirrors the checks of the PSA admission plugin that a chart can get wrong.
 */
export function restrictedViolations(spec: Manifest): string[] {
  const out: string[] = [];
  const podSc = spec.securityContext ?? {};
  if (spec.hostNetwork || spec.hostPID || spec.hostIPC) out.push('host namespaces');
  for (const v of spec.volumes ?? []) {
    const type = Object.keys(v).find((k) => k !== 'name');
    if (!type || !RESTRICTED_VOLUME_TYPES.has(type)) out.push(`volume ${v.name}: type ${type}`);
  }
  const containers = [...(spec.initContainers ?? []), ...(spec.containers ?? [])];
  for (const c of containers) {
    const sc = c.securityContext ?? {};
    const where = `container ${c.name}`;
    if (sc.privileged) out.push(`${where}: privileged`);
    if (sc.allowPrivilegeEscalation !== false) out.push(`${where}: allowPrivilegeEscalation must be false`);
    const drop: string[] = sc.capabilities?.drop ?? [];
    if (!drop.includes('ALL')) out.push(`${where}: capabilities must drop ALL`);
    const add: string[] = sc.capabilities?.add ?? [];
    if (add.some((a) => a !== 'NET_BIND_SERVICE')) out.push(`${where}: adds capabilities ${add.join(',')}`);
    if ((sc.runAsNonRoot ?? podSc.runAsNonRoot) !== true) out.push(`${where}: runAsNonRoot must be true`);
    if ((sc.runAsUser ?? podSc.runAsUser) === 0) out.push(`${where}: runAsUser 0`);
    const seccomp = sc.seccompProfile?.type ?? podSc.seccompProfile?.type;
    if (seccomp !== 'RuntimeDefault' && seccomp !== 'Localhost') out.push(`${where}: seccompProfile ${seccomp}`);
    for (const p of c.ports ?? []) if (p.hostPort) out.push(`${where}: hostPort`);
  }
  return out;
}
