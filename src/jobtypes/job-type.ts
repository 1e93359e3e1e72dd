/**
 * Job types (SPEC §2.7): the environment a run executes in. The registry is the only source of them;
 * the local registry reads the config file, the cluster registry watches JobType custom resources.
 */
import { BUILTIN_JOB_TYPES, JobTypeConfigSchema, type Config, type JobTypeConfig } from '../config.ts';
import * as v from 'valibot';
import { canonical, sha256 } from '../util/json.ts';

/** One pinned requirement of a built environment (the lock file's line). */
export interface LockedRequirement {
  /** Normalized distribution name (PEP 503). */
  name: string;
  version: string;
  /** sha256 of the wheel or sdist that was installed; null when pip could not name one. */
  sha256: string | null;
}

/** A built environment: what a run of a built job type uses instead of installing anything. */
export interface BuiltEnvironment {
  /** sha256 over the Python version, the base (interpreter or image), the runner and the lock. */
  digest: string;
  /** The environment: `local:sha256:<digest>` on the local runtime (no host path), or an image reference by digest. */
  imageRef: string;
  pythonVersion: string;
  lock: LockedRequirement[];
}


/** A job type's current (or a run's pinned) build: the environment plus its label. */
export interface JobTypeBuild extends BuiltEnvironment {
  /** Build record id (`GET /job-types/{name}/builds/{id}`). */
  id: string;
  /** `version_tag` of the build, or `latest`. */
  version: string;
  builtAt: Date;
}

/** A resolved job type, as runtimes consume it. */
export interface JobType {
  name: string;
  pythonVersion: string;
  requirements: string[];
  /** Modules the runner imports before it waits for the program (config `preload`); [] for none. */
  preload: string[];
  /** Service style memory limit, e.g. `512m`. */
  memoryLimit: string;
  cpuLimit: number;
  /**
   * Kubernetes requests of a run (what it reserves on a node); null: a fraction of the limit, see
   * `runtime/kubernetes/build-job.ts`. Equal to the limits: Guaranteed QoS.
   */
  cpuRequest: number | null;
  /** Service style, like `memoryLimit`; null: a fraction of the limit. */
  memoryRequest: string | null;
  /** Default execution timeout in seconds. */
  timeout: number;
  maxProcesses: number;
  /** Service style file size limit, e.g. `100m`. */
  maxFileSize: string;
  network: { mode: 'none' | 'bridge'; allowedHosts: string[] };
  /** Pre-built image with the requirements baked in, when one exists. */
  image: string | null;
  env: Record<string, string>;
  /** Version label (`latest` unless built with a tag). */
  version: string;
  /** sha256 of the canonical spec; `job_ref` is `<name>@sha256:<digest>`. */
  digest: string;
  /**
   * The built environment runs of this type use (set by the builds overlay, jobtypes/builds.ts); then
   * `version` is the build's label and `digest` the build's digest.
   */
  build?: JobTypeBuild | null;
  /**
   * Warm run pods kept for this type in a cluster (JobType `spec.warmPool.size`); undefined or null:
   * the service's default (`kubernetes.warm_pool_size`). Not part of the digest: it changes no run.
   */
  warmPoolSize?: number | null;
  /** Completion webhook of runs that name none (issue 21). Not part of the digest: it changes no run. */
  callbackUrl?: string | null;
}

/** The SPEC §2.7 wire shape of a job type. */
export interface JobTypeView {
  name: string;
  requirements: string[];
  python_version: string;
  memory_limit: string;
  cpu_limit: number;
  timeout: number;
  image_exists: boolean;
  network: { mode: 'none' | 'bridge'; allowed_hosts: string[] };
  version: string;
  job_ref: string;
  /** Digest of the current build (`job_ref`'s digest), null when the type has not been built. */
  digest: string | null;
  /** The current build (`local:sha256:<digest>` or an image by digest), else the configured image. */
  image_ref: string | null;
}

/** Anything that can answer "which job types exist". */
export interface JobTypeRegistry {
  get(name: string): JobType | undefined;
  list(): JobType[];
  /**
   * The job type as a run pinned to `jobRef` (its record's `job_ref`) sees it: with the build that
   * ref names, even after a rebuild. Registries without builds answer {@link get}.
   */
  pinned?(name: string, jobRef: string): JobType | undefined;
  /** Starts watching (cluster registry); the file registry has nothing to do. */
  start?(): Promise<void>;
  stop?(): Promise<void>;
}

/** Builds a resolved job type from its config form; the digest covers everything that changes a run. */
export function fromConfig(c: JobTypeConfig, defaultTimeout = 30): JobType {
  const spec = {
    name: c.name,
    pythonVersion: c.python_version,
    requirements: [...c.requirements],
    preload: [...c.preload],
    memoryLimit: c.memory_limit,
    cpuLimit: c.cpu_limit,
    timeout: c.timeout ?? defaultTimeout,
    maxProcesses: c.max_processes,
    maxFileSize: c.max_file_size,
    network: { mode: c.network.mode, allowedHosts: [...c.network.allowed_hosts] },
    image: c.image ?? null,
    env: { ...c.env },
    version: c.version,
    cpuRequest: c.cpu_request ?? null,
    memoryRequest: c.memory_request ?? null,
  };
  // Requests and preload enter the digest only when set, so the job_ref of a type that names none is
  // what it was before they existed.
  const { cpuRequest, memoryRequest, preload, ...rest } = spec;
  const digest = sha256(
    canonical({ ...rest, ...(cpuRequest !== null ? { cpuRequest } : {}), ...(memoryRequest !== null ? { memoryRequest } : {}), ...(preload.length > 0 ? { preload } : {}) }),
  );
  return { ...spec, digest, ...(c.callback_url ? { callbackUrl: c.callback_url } : {}) };
}

/** `<job_type>@sha256:<digest>` (SPEC §2.3 `job_ref`). */
export function jobRef(jt: JobType): string {
  return `${jt.name}@sha256:${jt.digest}`;
}

/** The job type as a run pinned to `ref` sees it (see {@link JobTypeRegistry.pinned}). */
export function pinnedJobType(registry: JobTypeRegistry, name: string, ref: string): JobType | undefined {
  return registry.pinned ? registry.pinned(name, ref) : registry.get(name);
}

/** The API view of a job type. */
export function toView(jt: JobType): JobTypeView {
  return {
    name: jt.name,
    requirements: jt.requirements,
    python_version: jt.pythonVersion,
    memory_limit: jt.memoryLimit,
    cpu_limit: jt.cpuLimit,
    timeout: jt.timeout,
    image_exists: jt.image !== null || !!jt.build,
    network: { mode: jt.network.mode, allowed_hosts: jt.network.allowedHosts },
    version: jt.version,
    job_ref: jobRef(jt),
    digest: jt.build?.digest ?? null,
    image_ref: jt.build?.imageRef ?? jt.image,
  };
}

/** Job types from the configuration file: the built-ins, overridden or extended by `job_types`. */
export class FileJobTypeRegistry implements JobTypeRegistry {
  private readonly types = new Map<string, JobType>();
  constructor(config: Pick<Config, 'job_types' | 'default_timeout'>) {
    for (const raw of BUILTIN_JOB_TYPES) {
      const jt = fromConfig(v.parse(JobTypeConfigSchema, raw), config.default_timeout);
      this.types.set(jt.name, jt);
    }
    for (const c of config.job_types) this.types.set(c.name, fromConfig(c, config.default_timeout));
  }
  get(name: string): JobType | undefined {
    return this.types.get(name);
  }
  list(): JobType[] {
    return [...this.types.values()].sort((a, b) => a.name.localeCompare(b.name));
  }
}
