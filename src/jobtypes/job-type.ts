/**
 * Job types (SPEC §2.7): the environment a run executes in. The registry is the only source of them;
 * the local registry reads the config file, the cluster registry watches JobType custom resources.
 */
import { BUILTIN_JOB_TYPES, JobTypeConfigSchema, type Config, type JobTypeConfig } from '../config.ts';
import * as v from 'valibot';
import { canonical, sha256 } from '../util/json.ts';

/** A resolved job type, as runtimes consume it. */
export interface JobType {
  name: string;
  pythonVersion: string;
  requirements: string[];
  /** Service style memory limit, e.g. `512m`. */
  memoryLimit: string;
  cpuLimit: number;
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
}

/** Anything that can answer "which job types exist". */
export interface JobTypeRegistry {
  get(name: string): JobType | undefined;
  list(): JobType[];
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
    memoryLimit: c.memory_limit,
    cpuLimit: c.cpu_limit,
    timeout: c.timeout ?? defaultTimeout,
    maxProcesses: c.max_processes,
    maxFileSize: c.max_file_size,
    network: { mode: c.network.mode, allowedHosts: [...c.network.allowed_hosts] },
    image: c.image ?? null,
    env: { ...c.env },
    version: c.version,
  };
  const digest = sha256(canonical(spec));
  return { ...spec, digest };
}

/** `<job_type>@sha256:<digest>` (SPEC §2.3 `job_ref`). */
export function jobRef(jt: JobType): string {
  return `${jt.name}@sha256:${jt.digest}`;
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
    image_exists: jt.image !== null,
    network: { mode: jt.network.mode, allowed_hosts: jt.network.allowedHosts },
    version: jt.version,
    job_ref: jobRef(jt),
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
