/**
 * Service configuration: one valibot schema over the `SVC_CONFIG` file (YAML or JSON) plus a few
 * environment variables, parsed once at start and frozen. Every key of SPEC §8 is accepted, plus what
 * the runtimes need. An invalid file is reported with the key path and the problem.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import * as v from 'valibot';
import YAML from 'yaml';
import { HttpConfigSchema } from './api/http-config.ts';
import { withEnvOverrides } from './config-env.ts';
import { int, KubernetesConfigSchema } from './config-kubernetes.ts';
import { isHostPattern } from './jobtypes/host-patterns.ts';
import { WebhooksConfigSchema } from './webhooks/config.ts';

/** A dotted Python module name (`numpy`, `xml.etree.ElementTree`). */
const MODULE_RE = /^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$/;

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
export const JobTypeConfigSchema = v.pipe(
  v.object({
    name: v.pipe(v.string(), v.regex(/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, 'must be a DNS-1123 label')),
    python_version: v.optional(v.pipe(v.string(), v.regex(/^3\.\d+$/, 'must look like 3.11')), '3.11'),
    requirements: v.optional(v.array(v.pipe(v.string(), v.minLength(1))), []),
    /**
     * Modules the runner imports before it waits for a program (warm sandboxes), so the program's own
     * import of them costs nothing. One that fails at preload is logged and skipped (the program gets
     * the real error when it imports it).
     */
    preload: v.optional(v.pipe(v.array(v.pipe(v.string(), v.regex(MODULE_RE, 'must be a Python module name such as numpy or os.path'))), v.maxLength(64)), []),
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
    /**
     * What a run reserves on a node (Kubernetes requests), apart from its limits; absent: a fraction of
     * the limit (`kubernetes.cpu_request_fraction` / `memory_request_fraction`). Equal to the limits:
     * Guaranteed QoS. The local runtime enforces limits only.
     */
    cpu_request: v.optional(v.pipe(v.number(), v.minValue(0.001), v.maxValue(64))),
    memory_request: v.optional(MemorySchema),
    /** Completion webhook of this type's runs that name none (issue 21); checked against `webhooks.allowed_hosts`. */
    callback_url: v.optional(v.nullable(v.pipe(v.string(), v.minLength(1))), null),
  }),
  // Kubernetes refuses a request above its limit: say so at load time, naming the field.
  v.forward(
    v.check((t) => t.cpu_request === undefined || t.cpu_request <= t.cpu_limit, 'must not exceed cpu_limit'),
    ['cpu_request'],
  ),
  v.forward(
    v.check((t) => t.memory_request === undefined || parseMemory(t.memory_request) <= parseMemory(t.memory_limit), 'must not exceed memory_limit'),
    ['memory_request'],
  ),
);
export type JobTypeConfig = v.InferOutput<typeof JobTypeConfigSchema>;

/** The three built-in examples of SPEC §2.7; a config file's `job_types` entries override them by name. */
export const BUILTIN_JOB_TYPES: readonly v.InferInput<typeof JobTypeConfigSchema>[] = [
  { name: 'default', memory_limit: '512m', cpu_limit: 1 },
  {
    name: 'data',
    requirements: ['numpy', 'pandas'],
    preload: ['numpy', 'pandas'],
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

/** Schema of the whole configuration (file keys; env values are merged in before parsing). */
export const ConfigSchema = v.pipe(
  v.strictObject({
    // SPEC §8
    production_mode: v.optional(v.boolean(), false),
    max_workers: v.optional(int(1, 256), 4),
    max_queue_size: v.optional(int(1), 100),
    /** Live sessions (issue 19) allowed at once, all processes; over it POST /sessions is 503. 0 turns sessions off. */
    max_sessions: v.optional(int(0, 1000), 8),
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
    /** Address to listen on: loopback by default; the chart and the image set 0.0.0.0 (`SVC_HOST`). */
    host: v.optional(v.pipe(v.string(), v.minLength(1)), '127.0.0.1'),
    workspace: v.optional(v.string(), '.workspace'),
    database_url: v.optional(v.nullable(v.string()), null),
    /** The statements on a run's critical path are prepared once per connection (src/store/prepared.ts). */
    database_prepared_statements: v.optional(v.boolean(), true),
    log_level: v.optional(v.picklist(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']), 'info'),
    /** Bearer tokens for the API (`/livez`, `/readyz`, `/health` stay open); none configured: no authentication. */
    auth: v.optional(
      v.object({
        tokens: v.optional(v.array(v.pipe(v.string(), v.minLength(16, 'API tokens must have at least 16 characters'), v.regex(/^\S+$/, 'API tokens cannot hold spaces'))), []),
        tokens_file: v.optional(v.nullable(v.pipe(v.string(), v.minLength(1))), null),
      }),
      {},
    ),
    /** Allowed Host names without authentication, event-stream caps (api/http-config.ts). */
    http: HttpConfigSchema,
    /** `json` (one object per line), `pretty` (for people), or `auto`: pretty when stdout is a terminal. */
    log_format: v.optional(v.picklist(['auto', 'json', 'pretty']), 'auto'),
    /** Largest accepted `code`, in bytes of UTF-8. */
    max_code_bytes: v.optional(int(1), 100 * 1024),
    /** Largest accepted `input_data`, in bytes of its JSON. */
    max_input_bytes: v.optional(int(2), 1024 * 1024),
    /** Largest accepted request body, in bytes. */
    max_body_bytes: v.optional(int(1024), 2 * 1024 * 1024),
    /** Seconds SIGTERM waits for running work before exiting. */
    shutdown_grace_seconds: v.optional(int(0, 3600), 30),
    /**
     * A process holding runs renews its liveness lease every heartbeat (2 s) on the database's clock;
     * only once it has not for this long may another process take its runs over (queue/leases.ts).
     */
    holder_lease_seconds: v.optional(int(1, 3600), 30),
    runtime: v.optional(v.picklist(['local', 'kubernetes']), 'local'),
    /** Run queued jobs in this process. False makes an API-only replica that only accepts and serves. */
    dispatch: v.optional(v.boolean(), true),
    // local runtime
    sandbox_engine: v.optional(v.picklist(['auto', 'gvisor', 'bubblewrap', 'process']), 'auto'),
    /** runsc platform; ptrace works everywhere, kvm needs /dev/kvm. */
    gvisor_platform: v.optional(v.picklist(['ptrace', 'systrap', 'kvm']), 'ptrace'),
    /** Interpreter per python_version on the local runtime. */
    python_interpreters: v.optional(v.record(v.string(), v.string()), { '3.11': '/usr/bin/python3' }),
    /**
     * Local warm sandboxes (issue 10; src/runtime/local/pool/sandbox-pool.ts). `sizes`: waiting sandboxes
     * per job type name (which types are kept warm); null (the default) means `{ default:
     * min(4, max_workers) }`, `{}` turns the pool off. A sandbox waiting longer than `max_idle_sec`
     * is replaced; at most `max_starting` start at once. `session_sizes`: ready session sandboxes per
     * job type name, on both runtimes (issue 19; null means `{ default: 1 }`, `{}` keeps none unless
     * used: a type whose sessions were opened within `max_idle_sec` keeps at least one).
     */
    warm_pool: v.optional(
      v.object({
        sizes: v.optional(v.nullable(v.record(v.string(), int(0, 64))), null),
        session_sizes: v.optional(v.nullable(v.record(v.string(), int(0, 16))), null),
        max_idle_sec: v.optional(int(1), 300),
        max_starting: v.optional(int(1, 16), 2),
        /**
         * gVisor: refill from a checkpoint (src/runtime/local/pool/restore-images.ts): the first sandbox
         * of each pool key is booted and checkpointed, later ones are restored from its image.
         */
        restore: v.optional(v.boolean(), false),
        /**
         * Sizes that follow demand (local pool, src/runtime/local/pool/pool-sizing.ts): per pool key, the
         * fewest sandboxes whose Erlang-B miss share at (claims/s over `window_sec`) × (measured refill
         * time) is at most `miss_target`, at least the configured size while the key is claimed, at
         * most `max_per_type`, all keys together at most `max_total`; zero after `max_idle_sec` unclaimed.
         */
        autoscale: v.optional(
          v.object({
            enabled: v.optional(v.boolean(), false),
            max_per_type: v.optional(int(1, 64), 8),
            max_total: v.optional(int(1, 256), 16),
            window_sec: v.optional(int(1, 3600), 60),
            miss_target: v.optional(v.pipe(v.number(), v.minValue(0.001), v.maxValue(0.5)), 0.1),
          }),
          {},
        ),
      }),
      {},
    ),
    pip: v.optional(
      v.object({
        index_url: v.optional(v.nullable(v.string()), null),
        find_links: v.optional(v.array(v.string()), []),
        no_index: v.optional(v.boolean(), false),
        extra_args: v.optional(v.array(v.string()), []),
        /**
         * Hosts an install may reach besides those of the index URLs above (e.g. where an index's
         * files are served from): allowed_hosts patterns (install-sandbox.ts).
         */
        allowed_hosts: v.optional(
          v.array(v.pipe(v.string(), v.check(isHostPattern, 'must be a host pattern: a name, *.domain, * or an IP address, optionally with :port'))),
          [],
        ),
      }),
      {},
    ),
    // kubernetes runtime
    kubernetes: v.optional(KubernetesConfigSchema, {}),
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
    /** Signed completion callbacks (issue 21; src/webhooks/config.ts). */
    webhooks: WebhooksConfigSchema,
    /** Job-type builds (SPEC §4.9, `POST /job-types/{name}/build`). */
    builds: v.optional(
      v.object({
        /** Longest a build may take (resolution and install). */
        timeout_seconds: v.optional(int(10, 24 * 3600), 1800),
        /**
         * A replica building a job type renews its lease this often (seconds / 3); another replica takes a
         * build over when its lease is older than this (the builder crashed).
         */
        lease_seconds: v.optional(int(3, 3600), 60),
      }),
      {},
    ),
  }),
  v.check((c) => c.default_timeout <= c.max_timeout, 'default_timeout must not exceed max_timeout'),
);

export type Config = Readonly<v.InferOutput<typeof ConfigSchema>>;

/** Warm sandboxes wanted per job type name: `warm_pool.sizes`, or its default. */
export function warmPoolSizes(config: Pick<Config, 'warm_pool' | 'max_workers'>): Record<string, number> {
  return config.warm_pool.sizes ?? { default: Math.min(4, config.max_workers) };
}

/** Ready session sandboxes wanted per job type name (issue 19): `warm_pool.session_sizes`, or its default. */
export function sessionPoolSizes(config: Pick<Config, 'warm_pool'>): Record<string, number> {
  return config.warm_pool.session_sizes ?? { default: 1 };
}

/** `max_input_bytes` default with the Kubernetes runtime. */
export const KUBERNETES_DEFAULT_MAX_INPUT_BYTES = 512 * 1024;
/** Largest code + input that fits a run's Secret (Kubernetes caps one at 1 MiB), with room for its input files' names. */
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
 * Env wins over the file: `PORT` and the variables of config-env.ts.
 */
export function parseConfig(raw: unknown, env: NodeJS.ProcessEnv = process.env): Config {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ConfigError('configuration must be a mapping of keys to values');
  }
  const merged = withEnvOverrides(raw as Record<string, unknown>, env);
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
    // Code and input travel to the run pod in a Secret, which Kubernetes caps at 1 MiB: a smaller
    // default input cap, and a hard check on the sum.
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
