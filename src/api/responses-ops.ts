/**
 * Response schemas of the operations side: job types and their builds, health and probes, pool stats and
 * the dead letter queue. Same rules as responses.ts (strict objects, `ref` names the component), which
 * re-exports everything here so routes import one module.
 */
import * as v from 'valibot';
import { int, nonNegInt, nullableTimestamp, page, ref, sha256Hex, timestamp } from './schema-parts.ts';

/** SPEC §2.7 job type. */
export const JobTypeSchema = v.pipe(
  v.strictObject({
    name: v.string(),
    requirements: v.array(v.string()),
    python_version: v.string(),
    memory_limit: v.string(),
    cpu_limit: v.number(),
    timeout: int,
    image_exists: v.boolean(),
    network: v.strictObject({ mode: v.picklist(['none', 'bridge']), allowed_hosts: v.array(v.string()) }),
    version: v.pipe(v.string(), v.description('Label runs record as job_version: the current build\'s version_tag, or `latest`')),
    job_ref: v.pipe(v.string(), v.description('<job_type>@sha256:<digest>: the current build, or the spec digest of an unbuilt type')),
    digest: v.pipe(v.nullable(sha256Hex), v.description('Digest of the current build; null when the type has no build for its current requirements')),
    image_ref: v.pipe(v.nullable(v.string()), v.description('The current build: an image by digest, or on the local runtime `local:sha256:<digest>`; else the configured image')),
  }),
  ref('JobType', 'SPEC §2.7 job type (environment).'),
);

/** One pinned distribution of a build. */
const LockedRequirementSchema = v.strictObject({ name: v.string(), version: v.string(), sha256: v.nullable(sha256Hex) });

/** `POST /job-types/{name}/build`, `GET /job-types/{name}/builds/{id}` (SPEC §4.9). */
export const BuildSchema = v.pipe(
  v.strictObject({
    id: v.pipe(v.string(), v.description('Build id: GET /job-types/{name}/builds/{id} follows it')),
    status: v.picklist(['building', 'built', 'failed']),
    job_type: v.string(),
    version: v.pipe(v.nullable(v.string()), v.description('<job_type>@sha256:<digest> once built')),
    digest: v.nullable(sha256Hex),
    image_ref: v.pipe(v.nullable(v.string()), v.description('An image by digest, or on the local runtime `local:sha256:<digest>` (never a host path)')),
    version_tag: v.pipe(v.nullable(v.string()), v.description('The semantic version label asked for; runs record it as job_version (else `latest`)')),
    phase: v.pipe(v.string(), v.description('Progress: queued, installing, publishing, built or failed')),
    python_version: v.string(),
    requirements: v.array(v.string()),
    resolved_requirements: v.pipe(v.nullable(v.array(LockedRequirementSchema)), v.description('The lock: every installed distribution with its version and archive sha256')),
    duration_ms: v.nullable(nonNegInt),
    error: v.pipe(v.nullable(v.string()), v.description("The builder's message when the build failed")),
    created_at: timestamp,
    finished_at: nullableTimestamp,
  }),
  ref('JobTypeBuild', 'A job-type build (SPEC §4.9).'),
);

/** `GET /job-types/{name}/builds` */
export const BuildListSchema = v.array(BuildSchema);

/** `GET /job-types` */
export const JobTypeListSchema = v.array(JobTypeSchema);

const breakerSnapshot = v.pipe(
  v.strictObject({
    state: v.picklist(['closed', 'open', 'half_open']),
    failure_count: nonNegInt,
    success_count: nonNegInt,
    last_failure: nullableTimestamp,
  }),
  ref('CircuitBreaker'),
);

/** SPEC §2.10 health object plus the runtime, sandbox and database. */
export const HealthSchema = v.pipe(
  v.strictObject({
    status: v.picklist(['healthy', 'degraded', 'draining']),
    reasons: v.pipe(v.array(v.string()), v.description('Why the status is degraded (empty when healthy): engine unavailable, circuit breaker open, database down, a failed preflight of the run sandbox')),
    docker_available: v.pipe(v.boolean(), v.description('The sandbox engine in use can start a sandbox now')),
    gvisor_available: v.boolean(),
    circuit_breaker: breakerSnapshot,
    version: v.string(),
    production_mode: v.boolean(),
    queue_stats: v.strictObject({ pending: nonNegInt, running: nonNegInt, max_workers: nonNegInt, max_queue_size: nonNegInt }),
    runtime: v.picklist(['local', 'kubernetes']),
    sandbox: v.strictObject({
      engine: v.string(),
      isolated: v.boolean(),
      limits: v.string(),
      security_mode: v.picklist(['permissive', 'strict']),
      warning: v.optional(v.string()),
      detail: v.optional(v.pipe(v.record(v.string(), v.unknown()), v.description('Engine-specific facts (cgroup version, seccomp, gVisor platform…); an open object'))),
    }),
    database: v.strictObject({ kind: v.picklist(['postgres', 'pglite']), available: v.boolean() }),
  }),
  ref('Health', 'SPEC §2.10; status 200 when healthy, 503 when degraded.'),
);

/** `GET /livez` */
export const LiveSchema = v.pipe(v.strictObject({ status: v.literal('ok') }), ref('Liveness'));

/** `GET /readyz` */
export const ReadySchema = v.pipe(v.strictObject({ status: v.picklist(['ready', 'shutting_down', 'database_unavailable']) }), ref('Readiness'));

const typeCounts = v.strictObject({ queued: nonNegInt, running: nonNegInt });

/** `GET /pool/stats` */
export const PoolStatsSchema = v.pipe(
  v.strictObject({
    worker_id: v.pipe(v.string(), v.description('This process')),
    slots: v.strictObject({ size: nonNegInt, busy: nonNegInt, free: nonNegInt, waiting_sync: nonNegInt }),
    queue: v.strictObject({ queued: nonNegInt, running: nonNegInt, max_queue_size: nonNegInt, oldest_queued_age_ms: v.nullable(nonNegInt) }),
    by_job_type: v.record(v.string(), typeCounts),
    breaker: v.picklist(['closed', 'open', 'half_open']),
    warm: v.pipe(
      v.array(
        v.strictObject({
          job_type: v.string(),
          target: nonNegInt,
          ready: nonNegInt,
          starting: nonNegInt,
          oldest_age_ms: v.nullable(nonNegInt),
          newest_age_ms: v.nullable(nonNegInt),
          hits: nonNegInt,
          misses: nonNegInt,
          refill_ms: v.optional(v.nullable(nonNegInt)),
          restored: v.optional(nonNegInt),
        }),
      ),
      v.description('Warm sandboxes per job type (local runtime; empty when none are kept): waiting counts, ages of the ready ones, runs that found one (hits) or started cold (misses); target follows demand with warm_pool.autoscale; refill_ms is the mean start-to-ready time; restored counts sandboxes restored from a checkpoint (gVisor, warm_pool.restore)'),
    ),
    sessions: v.pipe(
      v.array(v.strictObject({ job_type: v.string(), target: nonNegInt, ready: nonNegInt, starting: nonNegInt, hits: nonNegInt, misses: nonNegInt })),
      v.description('Session sandboxes kept ready per job type (issue 19; empty when none are kept): target is warm_pool.session_sizes, at least 1 while sessions of the type are opened; hits and misses count sessions without extra requirements that found a ready one or started their own'),
    ),
  }),
  ref('PoolStats', 'Slots are this process\'s; the queue is shared by every process on the database.'),
);

/** SPEC §2.9 dead letter queue entry. */
export const DlqEntrySchema = v.pipe(
  v.strictObject({
    id: int,
    job_id: v.string(),
    job_data: v.pipe(
      v.looseObject({ code: v.string(), input_data: v.unknown(), job_type: v.string() }),
      v.description('What is needed to run the job again (code, input_data, job_type, and its settings)'),
    ),
    error_type: v.string(),
    error_message: v.string(),
    retry_count: nonNegInt,
    created_at: timestamp,
    client_ip: v.nullable(v.string()),
    correlation_id: v.nullable(v.string()),
  }),
  ref('DlqEntry', 'SPEC §2.9'),
);

/** `GET /dlq` */
export const DlqPageSchema = page(DlqEntrySchema, 'DlqPage');

/** `GET /dlq/stats` */
export const DlqStatsSchema = v.pipe(
  v.strictObject({ total: nonNegInt, by_error_type: v.record(v.string(), nonNegInt) }),
  ref('DlqStats', 'SPEC §2.9 statistics.'),
  v.examples([{ total: 2, by_error_type: { internal_error: 1, service_unavailable: 1 } }]),
);

/** `DELETE /dlq/{id}` */
export const DlqDeletedSchema = v.pipe(v.strictObject({ id: int, deleted: v.literal(true) }), ref('DlqDeleted'));
