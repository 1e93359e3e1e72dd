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
    memoryLimit?: string | number;
    cpuLimit?: number;
    timeout?: number;
    maxProcesses?: number;
    maxFileSize?: string | number;
    network?: { mode?: 'none' | 'bridge'; allowedHosts?: string[] };
    image?: string;
    env?: Record<string, string>;
    version?: string;
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
  put('memory_limit', s.memoryLimit);
  put('cpu_limit', s.cpuLimit);
  put('timeout', s.timeout);
  put('max_processes', s.maxProcesses);
  put('max_file_size', s.maxFileSize);
  if (s.network) raw.network = { ...(s.network.mode ? { mode: s.network.mode } : {}), ...(s.network.allowedHosts ? { allowed_hosts: s.network.allowedHosts } : {}) };
  put('image', s.image);
  put('env', s.env);
  put('version', s.version);
  const parsed = v.safeParse(JobTypeConfigSchema, raw);
  if (!parsed.success) return { error: formatIssues(parsed.issues) };
  return fromConfig(parsed.output);
}

/** See the module comment. `start()` resolves once the first list is in. */
export class KubernetesJobTypeRegistry implements JobTypeRegistry {
  private readonly informer: ReconnectingInformer<JobTypeResource>;
  private types = new Map<string, JobType>();
  private readonly builtinDefault: JobType;
  private readonly log: Logger;

  constructor(config: Pick<Config, 'kubernetes'>, opts: KubernetesJobTypeRegistryOptions = {}) {
    const kc = opts.kubeConfig ?? defaultKubeConfig();
    const api = new KubeApi(kc);
    const ns = config.kubernetes.namespace;
    this.log = opts.logger ?? silentLogger;
    this.builtinDefault = fromConfig(v.parse(JobTypeConfigSchema, BUILTIN_JOB_TYPES.find((t) => t.name === 'default')!));
    this.informer = new ReconnectingInformer<JobTypeResource>({
      kubeConfig: kc,
      name: 'jobtypes',
      path: `/apis/${JOBTYPE_API.group}/${JOBTYPE_API.version}/namespaces/${ns}/${JOBTYPE_API.plural}`,
      list: () => api.listCustom<JobTypeResource>(JOBTYPE_API.group, JOBTYPE_API.version, ns, JOBTYPE_API.plural),
      logger: this.log,
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
