/**
 * Turning a validated submission into a new record: job type resolution, timeout defaults and limits,
 * requirement checks, hashes. Shared by sync, async, rerun and fork.
 */
import { randomUUID } from 'node:crypto';
import type { Config } from '../config.ts';
import { AppError } from '../errors.ts';
import { jobRef, type JobType, type JobTypeRegistry } from '../jobtypes/job-type.ts';
import type { NewExecutionRow } from '../store/database.ts';
import { normalTraceparent, parseTraceparent } from '../tracing/spans.ts';
import { canonical, sha256 } from '../util/json.ts';
import { filesDigest, type InputArtifactRef, type InputFile } from './input-files.ts';
import { checkCallbackUrl } from '../webhooks/ssrf.ts';

/** A submission after edge validation (SPEC §2.1). */
export interface Submission {
  code: string;
  input_data: Record<string, unknown>;
  timeout?: number | undefined;
  startup_timeout?: number | undefined;
  job_type: string;
  requirements?: string[] | undefined;
  idempotency_key?: string | undefined;
  /** name → base64 content, placed under `/input/files/` (resolved into {@link files}). */
  input_files?: Record<string, string> | undefined;
  /** Artifacts of earlier jobs, placed under `/input/files/` (resolved into {@link files}). */
  input_artifacts?: InputArtifactRef[] | undefined;
  /** The resolved input files (`input-files.ts`); a rerun or fork carries its parent's. */
  files?: InputFile[] | undefined;
  /** Where the record is POSTed when it ends (issue 21); null: none, not even a default. */
  callback_url?: string | null | undefined;
}

/** Where a request came from. */
export interface RequestMeta {
  correlationId: string;
  clientIp: string | null;
  /** W3C traceparent the run's trace continues (the request's span, or the client's header). */
  traceparent?: string | null;
}

/**
 * Accepted requirement specifiers: a distribution name, optional extras, optional version clauses.
 * No URLs, paths or options — a requirement starting with `-` would be an option to pip.
 */
export const REQUIREMENT_RE =
  /^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?(?:\s*(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+(?:\s*,\s*(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+)*)?$/;

/** Resolves the job type or fails with a 400 naming the known ones. */
export function resolveJobType(registry: JobTypeRegistry, name: string): JobType {
  const jt = registry.get(name);
  if (!jt) {
    const known = registry.list().map((j) => j.name).join(', ');
    throw new AppError('validation_error', `job_type: unknown job type '${name}' (known: ${known})`);
  }
  return jt;
}

/** Merges job type and request requirements, deduplicated, order kept. */
export function mergedRequirements(jt: JobType, extra: readonly string[]): string[] {
  return [...new Set([...jt.requirements, ...extra.map((r) => r.trim())])];
}

/**
 * A request's extra requirements (a run's or a session's): each a package specifier; none at all, and
 * a job type with requirements only when built, under production_mode (SPEC §8). Throws the 400.
 */
export function checkRequirements(config: Pick<Config, 'production_mode'>, jt: JobType, requirements: readonly string[]): void {
  for (const r of requirements) {
    if (!REQUIREMENT_RE.test(r.trim())) {
      throw new AppError('validation_error', `requirements: '${r}' is not a package specifier (expected e.g. 'requests' or 'numpy>=1.26,<2')`);
    }
  }
  // production_mode (SPEC §8): nothing is installed at run time; a type with requirements runs only in
  // its built environment (or a configured image), and a request cannot add requirements.
  if (config.production_mode && mergedRequirements(jt, requirements).length > 0 && (requirements.length > 0 || (!jt.image && !jt.build))) {
    throw new AppError(
      'config_error',
      requirements.length > 0
        ? `production_mode: requirements are not installed at run time; add them to job type '${jt.name}' and build it (POST /job-types/${jt.name}/build)`
        : `production_mode: job type '${jt.name}' has requirements but no built environment; build it first with POST /job-types/${jt.name}/build`,
    );
  }
}

/** Builds the row of a new execution; throws 400s for what only the service can check. */
export function buildRow(
  config: Config,
  registry: JobTypeRegistry,
  s: Submission,
  opts: { mode: 'sync' | 'async'; status: 'queued' | 'running'; meta: RequestMeta; workerId?: string; parentId?: string; relationship?: 'rerun' | 'fork'; now: Date },
): NewExecutionRow {
  const jt = resolveJobType(registry, s.job_type);
  const timeout = s.timeout ?? Math.min(jt.timeout, config.max_timeout);
  if (timeout > config.max_timeout) {
    throw new AppError('validation_error', `timeout: must be between 1 and ${config.max_timeout} seconds (max_timeout), got ${timeout}`);
  }
  const startupTimeout = s.startup_timeout ?? 60;
  const requirements = s.requirements ?? [];
  checkRequirements(config, jt, requirements);
  const inputJson = canonical(s.input_data);
  const callbackUrl = callbackUrlOf(config, jt, s.callback_url);
  const started = opts.status === 'running';
  return {
    id: randomUUID(),
    status: opts.status,
    mode: opts.mode,
    job_type: jt.name,
    job_version: jt.version,
    job_ref: jobRef(jt),
    code: s.code,
    input_data: inputJson,
    code_hash: sha256(s.code),
    input_hash: sha256(inputJson),
    timeout_s: timeout,
    startup_timeout_s: startupTimeout,
    requirements: JSON.stringify(requirements),
    idempotency_key: s.idempotency_key ?? null,
    payload_hash: s.idempotency_key ? payloadHash(s, timeout, startupTimeout) : null,
    parent_execution_id: opts.parentId ?? null,
    relationship: opts.relationship ?? null,
    created_at: opts.now,
    started_at: started ? opts.now : null,
    phase: started ? 'startup' : null,
    claimed_by: started ? (opts.workerId ?? null) : null,
    heartbeat_at: started ? opts.now : null,
    attempts: started ? 1 : 0,
    input_files: s.files?.length ?? 0,
    client_ip: opts.meta.clientIp,
    correlation_id: opts.meta.correlationId,
    ...traceColumns(opts.meta.traceparent),
    callback_url: callbackUrl,
  };
}

/** The record's trace columns for a traceparent (nothing when there is none). */
function traceColumns(traceparent: string | null | undefined): { traceparent?: string; trace_id?: string } {
  const p = parseTraceparent(traceparent);
  const normal = normalTraceparent(traceparent);
  return p && normal ? { traceparent: normal, trace_id: p.traceId } : {};
}

/**
 * The callback of a submission (issue 21): its own `callback_url` (null opts out), else its job type's,
 * else `webhooks.default_callback_url`. Whichever it is must match `webhooks.allowed_hosts` (a 400
 * naming where it came from otherwise).
 */
export function callbackUrlOf(config: Pick<Config, 'webhooks'>, jt: JobType, asked: string | null | undefined): string | null {
  if (asked === null) return null;
  const [url, field] =
    asked !== undefined
      ? [asked, 'callback_url']
      : jt.callbackUrl
        ? [jt.callbackUrl, `callback_url of job type '${jt.name}'`]
        : [config.webhooks.default_callback_url, 'webhooks.default_callback_url'];
  if (url === null) return null;
  checkCallbackUrl(url, config.webhooks, field);
  return url;
}

/**
 * Hash of what makes two idempotent submissions "the same payload": canonical JSON of code,
 * input_data, job_type, timeout, startup_timeout and requirements — with defaults applied, so omitting
 * a field and sending its default are the same payload.
 */
export function payloadHash(s: Submission, timeout: number, startupTimeout: number): string {
  return sha256(
    canonical({
      code: s.code,
      input_data: s.input_data,
      job_type: s.job_type,
      timeout,
      startup_timeout: startupTimeout,
      requirements: s.requirements ?? [],
      // Only when there are files, so the hash of a submission without any is what it always was.
      ...(s.files?.length ? { input_files: filesDigest(s.files) } : {}),
      // Only when named, so the hash of a submission without one is what it was before callbacks.
      ...(s.callback_url !== undefined ? { callback_url: s.callback_url } : {}),
    }),
  );
}
