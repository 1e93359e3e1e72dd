/**
 * Service configuration: one valibot schema over the `SVC_CONFIG` file (YAML or JSON) plus a few
 * environment variables, parsed once at start and frozen. Every key of SPEC §8 is accepted, plus what
 * the runtimes need. An invalid file is reported with the key path and the problem.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import * as v from 'valibot';
import YAML from 'yaml';
import { isHostPattern } from './jobtypes/host-patterns.ts';

const MEMORY_RE = /^\d+(\.\d+)?\s*([kKmMgG]i?|[bB])?$/;

/** A memory quantity in the service style (`512m`, `1g`, `1Gi`, `268435456`). */
export const MemorySchema = v.pipe(
  v.union([v.string(), v.number()]),
  v.transform((x) => String(x).trim()),
  v.regex(MEMORY_RE, 'must be a memory size such as 512m, 1g or 1Gi'),
);

/** Network mode of a job type: none, or a bridge with an allow-list of host patterns. */
export const NetworkSchema = v.object({
  mode: v.optional(v.picklist(['none', 'bridge']), 'none'),
  allowed_hosts: v.optional(
    v.array(v.pipe(v.string(), v.check(isHostPattern, 'must be a host pattern: a name, *.domain, * or an IP address, optionally with :port'))),
    [],
  ),
});

/** Job type (SPEC §2.7) as declared in configuration. */
export const JobTypeConfigSchema = v.object({
  name: v.pipe(v.string(), v.regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a DNS-1123 label')),
  python_version: v.optional(v.pipe(v.string(), v.regex(/^3\.\d+$/, 'must look like 3.11')), '3.11'),
  requirements: v.optional(v.array(v.pipe(v.string(), v.minLength(1))), []),
  memory_limit: v.optional(MemorySchema, '512m'),
  cpu_limit: v.optional(v.pipe(v.number(), v.minValue(0.01), v.maxValue(64)), 1),
  /** Default execution timeout of the type; the service's `default_timeout` when absent. */
  timeout: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1))),
  max_processes: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1)), 64),
  max_file_size: v.optional(MemorySchema, '100m'),
  network: v.optional(NetworkSchema, { mode: 'none', allowed_hosts: [] }),
  image: v.optional(v.nullable(v.string()), null),
  env: v.optional(v.record(v.string(), v.string()), {}),
  version: v.optional(v.string(), 'latest'),
});
export type JobTypeConfig = v.InferOutput<typeof JobTypeConfigSchema>;

/** The three built-in examples of SPEC §2.7; a config file's `job_types` entries override them by name. */
export const BUILTIN_JOB_TYPES: readonly v.InferInput<typeof JobTypeConfigSchema>[] = [
  { name: 'default', memory_limit: '512m', cpu_limit: 1 },
  {
    name: 'data',
    requirements: ['numpy', 'pandas'],
    memory_limit: '1g',
    cpu_limit: 2,
    timeout: 60,
  },
  {
    name: 'http',
    requirements: ['requests', 'httpx'],
    memory_limit: '512m',
    cpu_limit: 1,
    timeout: 60,
    network: { mode: 'bridge', allowed_hosts: ['*.example.com', 'api.github.com'] },
  },
];

const int = (min: number, max = Number.MAX_SAFE_INTEGER) =>
  v.pipe(v.number(), v.integer(), v.minValue(min), v.maxValue(max));

/** Schema of the whole configuration (file keys; env values are merged in before parsing). */
export const ConfigSchema = v.pipe(
  v.strictObject({
    // SPEC §8
    production_mode: v.optional(v.boolean(), false),
    max_workers: v.optional(int(1, 256), 4),
    max_queue_size: v.optional(int(1), 100),
    default_timeout: v.optional(int(1), 30),
    max_timeout: v.optional(int(1), 120),
    max_stdout_bytes: v.optional(int(1024), 32768),
    max_artifact_bytes: v.optional(int(1), 5 * 1024 * 1024),
    enable_seccomp: v.optional(v.boolean(), true),
    security_mode: v.optional(v.picklist(['permissive', 'strict']), 'permissive'),
    container_runtime: v.optional(v.string(), 'runsc'),
    docker_image: v.optional(v.string(), 'ghcr.io/sandpod/executor:0.1.0'),
    // service
    port: v.optional(int(0, 65535), 8000),
    host: v.optional(v.string(), '0.0.0.0'),
    workspace: v.optional(v.string(), '.workspace'),
    database_url: v.optional(v.nullable(v.string()), null),
    log_level: v.optional(v.picklist(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']), 'info'),
    /** Largest accepted `code`, in bytes of UTF-8. */
    max_code_bytes: v.optional(int(1), 100 * 1024),
    /** Largest accepted `input_data`, in bytes of its JSON. */
    max_input_bytes: v.optional(int(2), 1024 * 1024),
    /** Largest accepted request body, in bytes. */
    max_body_bytes: v.optional(int(1024), 2 * 1024 * 1024),
    /** Seconds SIGTERM waits for running work before exiting. */
    shutdown_grace_seconds: v.optional(int(0, 3600), 30),
    runtime: v.optional(v.picklist(['local', 'kubernetes']), 'local'),
    /** Run queued jobs in this process. False makes an API-only replica that only accepts and serves. */
    dispatch: v.optional(v.boolean(), true),
    // local runtime
    sandbox_engine: v.optional(v.picklist(['auto', 'gvisor', 'bubblewrap', 'process']), 'auto'),
    /** runsc platform; ptrace works everywhere, kvm needs /dev/kvm. */
    gvisor_platform: v.optional(v.picklist(['ptrace', 'systrap', 'kvm']), 'ptrace'),
    /** Interpreter per python_version on the local runtime. */
    python_interpreters: v.optional(v.record(v.string(), v.string()), { '3.11': '/usr/bin/python3' }),
    pip: v.optional(
      v.object({
        index_url: v.optional(v.nullable(v.string()), null),
        find_links: v.optional(v.array(v.string()), []),
        no_index: v.optional(v.boolean(), false),
        extra_args: v.optional(v.array(v.string()), []),
      }),
      {},
    ),
    // kubernetes runtime
    kubernetes: v.optional(
      v.object({
        namespace: v.optional(v.string(), 'sandpod'),
        runs_namespace: v.optional(v.string(), 'sandpod-jobs'),
        instance: v.optional(v.string(), 'sandpod'),
        runtime_class: v.optional(v.string(), 'gvisor'),
        executor_image: v.optional(v.nullable(v.string()), null),
        image_pull_policy: v.optional(v.picklist(['Always', 'IfNotPresent', 'Never']), 'IfNotPresent'),
        ttl_seconds_after_finished: v.optional(int(0), 600),
        deadline_grace_seconds: v.optional(int(0), 30),
        watch_job_types: v.optional(v.boolean(), true),
      }),
      {},
    ),
    // resilience (SPEC §3, §7.3, §8 values as defaults)
    breaker: v.optional(
      v.object({
        failure_threshold: v.optional(int(1), 5),
        recovery_timeout_ms: v.optional(int(1), 30_000),
        success_threshold: v.optional(int(1), 2),
      }),
      {},
    ),
    retry: v.optional(
      v.object({
        attempts: v.optional(int(1, 10), 2),
        base_delay_ms: v.optional(int(0), 1000),
      }),
      {},
    ),
    job_types: v.optional(v.array(JobTypeConfigSchema), []),
  }),
  v.check((c) => c.default_timeout <= c.max_timeout, 'default_timeout must not exceed max_timeout'),
);

export type Config = Readonly<v.InferOutput<typeof ConfigSchema>>;

/** `max_input_bytes` default with the Kubernetes runtime. */
export const KUBERNETES_DEFAULT_MAX_INPUT_BYTES = 512 * 1024;
/** Largest code + input that fits a run's Secret next to the runner. */
export const KUBERNETES_MAX_PAYLOAD_BYTES = 900 * 1024;

/** Thrown when configuration is invalid; the message names every bad key. */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

/** Formats valibot issues as `key.path: problem` lines. */
export function formatIssues(issues: readonly v.BaseIssue<unknown>[]): string {
  return issues
    .map((i) => {
      const key = v.getDotPath(i) ?? '(root)';
      return `${key}: ${i.message}`;
    })
    .join('; ');
}

/** Reads and parses a config file (YAML or JSON; JSON is YAML). */
export function readConfigFile(file: string): unknown {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read SVC_CONFIG file ${file}: ${(err as Error).message}`);
  }
  try {
    const doc = YAML.parse(text) as unknown;
    return doc ?? {};
  } catch (err) {
    throw new ConfigError(`SVC_CONFIG file ${file} is not valid YAML/JSON: ${(err as Error).message}`);
  }
}

/**
 * Builds the frozen configuration from a raw object (file contents) and the environment.
 * Env wins over the file: `SVC_WORKSPACE`, `SVC_DATABASE_URL`, `PORT`, `SVC_LOG_LEVEL`.
 */
export function parseConfig(raw: unknown, env: NodeJS.ProcessEnv = process.env): Config {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ConfigError('configuration must be a mapping of keys to values');
  }
  const merged: Record<string, unknown> = { ...(raw as Record<string, unknown>) };
  if (env.SVC_WORKSPACE) merged.workspace = env.SVC_WORKSPACE;
  if (env.SVC_DATABASE_URL) merged.database_url = env.SVC_DATABASE_URL;
  if (env.SVC_LOG_LEVEL) merged.log_level = env.SVC_LOG_LEVEL;
  if (env.PORT !== undefined && env.PORT !== '') {
    const port = Number(env.PORT);
    if (!Number.isInteger(port)) throw new ConfigError(`PORT: must be an integer, got ${JSON.stringify(env.PORT)}`);
    merged.port = port;
  }
  const result = v.safeParse(ConfigSchema, merged);
  if (!result.success) throw new ConfigError(`invalid configuration: ${formatIssues(result.issues)}`);
  const cfg = result.output;
  cfg.workspace = path.resolve(cfg.workspace);
  if (cfg.runtime === 'kubernetes') {
    // Code and input travel to the run pod in a Secret, which Kubernetes caps at 1 MiB (the runner
    // rides along): a smaller default input cap, and a hard check on the sum.
    if (merged.max_input_bytes === undefined) cfg.max_input_bytes = KUBERNETES_DEFAULT_MAX_INPUT_BYTES;
    if (cfg.max_input_bytes + cfg.max_code_bytes > KUBERNETES_MAX_PAYLOAD_BYTES) {
      throw new ConfigError(
        `invalid configuration: max_input_bytes + max_code_bytes must not exceed ${KUBERNETES_MAX_PAYLOAD_BYTES} with runtime kubernetes (run pods get code and input in a Secret, capped at 1 MiB)`,
      );
    }
  }
  const names = new Set<string>();
  for (const jt of cfg.job_types) {
    if (names.has(jt.name)) throw new ConfigError(`invalid configuration: job_types: duplicate name ${jt.name}`);
    names.add(jt.name);
  }
  return deepFreeze(cfg);
}

/** Loads configuration from `SVC_CONFIG` (when set) and the environment. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const raw = env.SVC_CONFIG ? readConfigFile(env.SVC_CONFIG) : {};
  return parseConfig(raw, env);
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === 'object') {
    for (const value of Object.values(o)) deepFreeze(value);
    Object.freeze(o);
  }
  return o;
}

/** Parses a memory quantity (`512m`, `1g`, `1Gi`, `100k`, plain bytes) to bytes. */
export function parseMemory(q: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*([kKmMgG]i?|[bB])?$/.exec(q.trim());
  if (!m) throw new Error(`not a memory size: ${q}`);
  const n = Number(m[1]);
  const unit = (m[2] ?? '').toLowerCase().replace('i', '');
  const mult = unit === 'k' ? 1024 : unit === 'm' ? 1024 ** 2 : unit === 'g' ? 1024 ** 3 : 1;
  return Math.floor(n * mult);
}
