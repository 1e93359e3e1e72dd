/**
 * Job types from JobType custom resources (group `sandpod.io`, version `v1alpha1`, plural
 * `jobtypes`) in the service namespace, watched so `GET /job-types` reflects changes without a
 * restart. The CRD in `crds/jobtypes.sandpod.io.yaml` is the schema; a resource that the service's
 * own job type schema still refuses is skipped (and logged), never half-applied.
 *
 * The built-in `default` job type stays available while no resource named `default` exists, so a
 * request without `job_type` never fails because the cluster has no JobTypes yet.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import * as v from 'valibot';
import { BUILTIN_JOB_TYPES, JobTypeConfigSchema, formatIssues, type Config } from '../config.ts';
import { KubeApi, ReconnectingInformer, defaultKubeConfig } from '../kube/index.ts';
import { silentLogger, type Logger } from '../logger.ts';
import { fromConfig, type JobType, type JobTypeRegistry } from './job-type.ts';

/** API coordinates of the JobType resource. */
export const JOBTYPE_API = { group: 'sandpod.io', version: 'v1alpha1', plural: 'jobtypes' } as const;

/** The JobType resource as served (only what we read). */
export interface JobTypeResource {
  metadata?: { name?: string; namespace?: string; resourceVersion?: string; uid?: string; generation?: number };
  spec?: {
    pythonVersion?: string;
    requirements?: string[];
    preload?: string[];
    memoryLimit?: string | number;
    cpuLimit?: number;
    timeout?: number;
    maxProcesses?: number;
    maxFileSize?: string | number;
    network?: { mode?: 'none' | 'bridge'; allowedHosts?: string[] };
    image?: string;
    env?: Record<string, string>;
    version?: string;
    cpuRequest?: number;
    memoryRequest?: string | number;
    warmPool?: { size?: number };
    callbackUrl?: string;
  };
}

/** Options of {@link KubernetesJobTypeRegistry}. */
export interface KubernetesJobTypeRegistryOptions {
  kubeConfig?: KubeConfig;
  logger?: Logger;
  informerBackoffInitialMs?: number;
  informerBackoffMaxMs?: number;
}

/** A JobType resource as a resolved job type, or the reason it is refused. */
export function jobTypeFromResource(r: JobTypeResource): JobType | { error: string } {
  const s = r.spec ?? {};
  const raw: Record<string, unknown> = { name: r.metadata?.name };
  const put = (key: string, value: unknown) => {
    if (value !== undefined && value !== null) raw[key] = value;
  };
  put('python_version', s.pythonVersion);
  put('requirements', s.requirements);
  put('preload', s.preload);
  put('memory_limit', s.memoryLimit);
  put('cpu_limit', s.cpuLimit);
  put('timeout', s.timeout);
  put('max_processes', s.maxProcesses);
  put('max_file_size', s.maxFileSize);
  if (s.network) raw.network = { ...(s.network.mode ? { mode: s.network.mode } : {}), ...(s.network.allowedHosts ? { allowed_hosts: s.network.allowedHosts } : {}) };
  put('image', s.image);
  put('env', s.env);
  put('version', s.version);
  put('cpu_request', s.cpuRequest);
  put('memory_request', s.memoryRequest);
  put('callback_url', s.callbackUrl);
  const parsed = v.safeParse(JobTypeConfigSchema, raw);
  if (!parsed.success) return { error: formatIssues(parsed.issues) };
  const size = s.warmPool?.size;
  if (size !== undefined && (!Number.isInteger(size) || size < 0 || size > 64)) return { error: 'warmPool.size: must be an integer from 0 to 64' };
  return { ...fromConfig(parsed.output), ...(size !== undefined ? { warmPoolSize: size } : {}) };
}

/** See the module comment. `start()` resolves once the first list is in. */
export class KubernetesJobTypeRegistry implements JobTypeRegistry {
  private readonly informer: ReconnectingInformer<JobTypeResource>;
  private types = new Map<string, JobType>();
  private readonly builtinDefault: JobType;
  private readonly log: Logger;

  constructor(config: Pick<Config, 'kubernetes'>, opts: KubernetesJobTypeRegistryOptions = {}) {
    const kc = opts.kubeConfig ?? defaultKubeConfig();
    const api = new KubeApi(kc, { requestTimeoutMs: config.kubernetes.api_timeout_seconds * 1000 });
    const ns = config.kubernetes.namespace;
    this.log = opts.logger ?? silentLogger;
    this.builtinDefault = fromConfig(v.parse(JobTypeConfigSchema, BUILTIN_JOB_TYPES.find((t) => t.name === 'default')!));
    this.informer = new ReconnectingInformer<JobTypeResource>({
      kubeConfig: kc,
      name: 'jobtypes',
      path: `/apis/${JOBTYPE_API.group}/${JOBTYPE_API.version}/namespaces/${ns}/${JOBTYPE_API.plural}`,
      list: () => api.listCustom<JobTypeResource>(JOBTYPE_API.group, JOBTYPE_API.version, ns, JOBTYPE_API.plural),
      logger: this.log,
      requestTimeoutMs: api.requestTimeoutMs,
      watchTimeoutSeconds: config.kubernetes.watch_timeout_seconds,
      ...(opts.informerBackoffInitialMs !== undefined ? { backoffInitialMs: opts.informerBackoffInitialMs } : {}),
      ...(opts.informerBackoffMaxMs !== undefined ? { backoffMaxMs: opts.informerBackoffMaxMs } : {}),
    });
    this.informer.on(() => this.rebuild());
  }

  async start(): Promise<void> {
    await this.informer.start();
    this.rebuild();
  }

  async stop(): Promise<void> {
    this.informer.stop();
  }

  get(name: string): JobType | undefined {
    return this.types.get(name) ?? (name === 'default' ? this.builtinDefault : undefined);
  }

  list(): JobType[] {
    const all = new Map(this.types);
    if (!all.has('default')) all.set('default', this.builtinDefault);
    return [...all.values()].sort((a, b) => a.name.localeCompare(b.name));
  }

  private rebuild(): void {
    const next = new Map<string, JobType>();
    for (const r of this.informer.list()) {
      const jt = jobTypeFromResource(r);
      if ('error' in jt) {
        this.log.warn({ job_type: r.metadata?.name, error: jt.error }, 'JobType resource refused');
        continue;
      }
      next.set(jt.name, jt);
    }
    this.types = next;
  }
}

// ── status (job-type builds) ─────────────────────────────────────────────────────────────────────

/** A `metav1.Condition` as the CRD's status schema has it. */
export interface JobTypeCondition {
  type: 'Building' | 'Ready' | 'Failed';
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

/** The JobType's `status` (crds/jobtypes.sandpod.io.yaml). */
export interface JobTypeStatus {
  observedGeneration?: number;
  imageDigest?: string;
  imageRef?: string;
  conditions?: JobTypeCondition[];
}

/** What a builder reports about a type's build. */
export type BuildStatusUpdate =
  | { phase: 'building'; message: string }
  | { phase: 'ready'; imageRef: string; message: string }
  | { phase: 'failed'; message: string };

/** Longest condition message the CRD accepts. */
const MAX_MESSAGE = 32768;

/**
 * The status after a build update (pure). `Building`, `Ready` and `Failed` are always all three
 * present; a condition's `lastTransitionTime` changes only when its status does. Ready keeps the
 * last built image while a rebuild runs; a failed build makes Ready False only when no image exists.
 */
export function nextJobTypeStatus(current: JobTypeStatus | undefined, update: BuildStatusUpdate, now: Date, generation?: number): JobTypeStatus {
  const at = now.toISOString().replace(/\.\d{3}Z$/, 'Z');
  const prior = new Map((current?.conditions ?? []).map((c) => [c.type, c]));
  const hasImage = update.phase === 'ready' || !!current?.imageDigest;
  const want: Record<JobTypeCondition['type'], { status: JobTypeCondition['status']; reason: string; message: string }> =
    update.phase === 'building'
      ? {
          Building: { status: 'True', reason: 'BuildStarted', message: update.message },
          Ready: prior.get('Ready') ?? { status: 'False', reason: 'NotBuilt', message: 'no image has been built for this job type yet' },
          Failed: { status: 'False', reason: 'BuildStarted', message: 'a build is running' },
        }
      : update.phase === 'ready'
        ? {
            Building: { status: 'False', reason: 'BuildSucceeded', message: 'no build is running' },
            Ready: { status: 'True', reason: 'BuildSucceeded', message: update.message },
            Failed: { status: 'False', reason: 'BuildSucceeded', message: 'the last build succeeded' },
          }
        : {
            Building: { status: 'False', reason: 'BuildFailed', message: 'no build is running' },
            Ready: hasImage ? (prior.get('Ready') ?? { status: 'True', reason: 'BuildSucceeded', message: 'an earlier build is ready' }) : { status: 'False', reason: 'BuildFailed', message: 'the last build failed' },
            Failed: { status: 'True', reason: 'BuildFailed', message: update.message },
          };
  const conditions = (['Building', 'Ready', 'Failed'] as const).map((type): JobTypeCondition => {
    const w = want[type];
    const old = prior.get(type);
    return {
      type,
      status: w.status,
      reason: w.reason,
      // Never empty: the API server reads an empty string in a JSON patch as null here, which the schema refuses.
      message: (w.message || w.reason).slice(-MAX_MESSAGE),
      lastTransitionTime: old && old.status === w.status ? old.lastTransitionTime : at,
      ...(generation !== undefined ? { observedGeneration: generation } : {}),
    };
  });
  const out: JobTypeStatus = { ...(current ?? {}), conditions };
  if (generation !== undefined) out.observedGeneration = generation;
  if (update.phase === 'ready') {
    const digest = /@(sha256:[a-f0-9]{64})$/.exec(update.imageRef)?.[1];
    if (digest) out.imageDigest = digest;
    out.imageRef = update.imageRef;
  }
  return out;
}

/**
 * Writes a build update to the JobType's status subresource (read, compute, JSON-patch `/status`).
 * False when there is no such resource (job types from the configuration file).
 */
export async function patchJobTypeStatus(api: KubeApi, namespace: string, name: string, update: BuildStatusUpdate, now: Date): Promise<boolean> {
  const { group, version, plural } = JOBTYPE_API;
  const current = await api.getCustom<{ metadata?: { generation?: number }; status?: JobTypeStatus }>(group, version, namespace, plural, name);
  if (!current) return false;
  const status = nextJobTypeStatus(current.status, update, now, current.metadata?.generation);
  await api.patchCustomStatus(group, version, namespace, plural, name, [{ op: 'add', path: '/status', value: status }]);
  return true;
}
