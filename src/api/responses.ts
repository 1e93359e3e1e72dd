/**
 * Response schemas: the wire shape of every JSON answer (SPEC §2, §4 and our decisions where SPEC is
 * silent). Routes declare them next to their handlers; the OpenAPI document is generated from them, and
 * the contract test validates real answers against that document. Fixed shapes are strict objects
 * (`additionalProperties: false`), so a field added to a view but not here fails the contract test.
 * `ref` metadata names the component the shape becomes in the document.
 */
import type { Context } from 'hono';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import * as v from 'valibot';
import { ERROR_STATUS } from '../errors.ts';
import { queueStatus, RECORD_STATUSES, TERMINAL_STATUSES } from '../executions/index.ts';
import { MAX_ARTIFACT_ENTRIES } from '../runtime/run-output.ts';
import { stringifyJson } from '../util/json.ts';
import { ID_EXAMPLE, TIME_EXAMPLE, int, nonNegInt, nullableTimestamp, page, ref, sha256Hex, timestamp } from './schema-parts.ts';

export * from './responses-ops.ts';


/** Queue-facing statuses (SPEC §3): `pending` where the record says `queued`. */
export const QUEUE_STATUSES = [...new Set(RECORD_STATUSES.map(queueStatus))] as const;

const recordStatus = v.picklist(RECORD_STATUSES);
const queueStatusSchema = v.picklist(QUEUE_STATUSES);

/** SPEC §2.6 error object of a run. */
export const RunErrorSchema = v.pipe(
  v.strictObject({
    type: v.pipe(v.string(), v.description('Error type of SPEC §7.2')),
    message: v.string(),
    phase: v.optional(v.picklist(['startup', 'execution'])),
  }),
  ref('RunError', 'SPEC §2.6: why a run failed.'),
);

/** SPEC §2.4 timing object. */
export const TimingSchema = v.pipe(
  v.strictObject({
    startup_ms: nonNegInt,
    dep_install_ms: nonNegInt,
    execution_ms: nonNegInt,
    total_ms: nonNegInt,
    phase_at_exit: v.picklist(['startup', 'execution', 'completed', 'failed']),
  }),
  ref('Timing', 'SPEC §2.4'),
);

/** SPEC §2.5 artifact metadata (`skipped` when the file was not kept). */
export const ArtifactSchema = v.pipe(
  v.strictObject({
    name: v.string(),
    size_bytes: nonNegInt,
    sha256: v.pipe(v.string(), v.regex(/^(?:[0-9a-f]{64})?$/), v.description('Hex SHA-256 of the content; empty when the file was skipped')),
    content_type: v.string(),
    skipped: v.optional(v.pipe(v.string(), v.description('Why the file was not kept: too_large, reserved_name, not_regular'))),
  }),
  ref('Artifact', 'SPEC §2.5'),
);

const recordBase = {
  execution_id: v.string(),
  job_id: v.pipe(v.string(), v.description('Same as execution_id')),
  status: recordStatus,
  job_type: v.string(),
  job_version: v.string(),
  created_at: timestamp,
  started_at: nullableTimestamp,
  ended_at: nullableTimestamp,
  duration_ms: v.nullable(nonNegInt),
  exit_code: v.nullable(int),
  stdout: v.string(),
  stderr: v.string(),
  output: v.pipe(v.unknown(), v.description('Parsed /output/result.json (numbers with their exact text), or null')),
  error: v.nullable(RunErrorSchema),
  timing: v.nullable(TimingSchema),
};

const recordExample = {
  execution_id: ID_EXAMPLE,
  job_id: ID_EXAMPLE,
  status: 'succeeded' as const,
  job_type: 'default',
  job_version: 'latest',
  created_at: TIME_EXAMPLE,
  started_at: TIME_EXAMPLE,
  ended_at: TIME_EXAMPLE,
  duration_ms: 41,
  exit_code: 0,
  stdout: '1\n',
  stderr: '',
  output: null,
  error: null,
  timing: { startup_ms: 3, dep_install_ms: 0, execution_ms: 35, total_ms: 41, phase_at_exit: 'completed' as const },
};

/** SPEC §2.3 execution record (without `view=full`). */
export const RecordSchema = v.pipe(v.strictObject(recordBase), ref('ExecutionRecord', 'SPEC §2.3 execution record.'), v.examples([recordExample]));

/** SPEC §2.3 execution record with the extended fields (`view=full`). */
export const FullRecordSchema = v.pipe(
  v.strictObject({
    ...recordBase,
    job_ref: v.pipe(v.string(), v.regex(/^.+@sha256:[0-9a-f]{64}$/), v.description('<job_type>@sha256:<digest>')),
    artifacts: v.pipe(v.array(ArtifactSchema), v.description(`At most ${MAX_ARTIFACT_ENTRIES} entries of /output, the first by name (see artifacts_truncated)`)),
    artifacts_total: v.pipe(nonNegInt, v.description('Entries the program left in /output, listed or not (result.json and the runner\'s own files aside)')),
    artifacts_truncated: v.pipe(v.boolean(), v.description('/output held more entries than artifacts lists (over the limit, or the collection stopped at its byte cap)')),
    input_artifacts: v.pipe(
      v.array(
        v.pipe(
          v.strictObject({
            ...ArtifactSchema.entries,
            path: v.optional(v.pipe(v.string(), v.description('Where the run saw the file: /input/files/<name>'))),
            source: v.optional(v.pipe(v.strictObject({ job_id: v.string(), name: v.string() }), v.description('The earlier job\'s artifact the file was taken from (input_artifacts)'))),
          }),
          ref('InputArtifact', 'SPEC §2.5 metadata of an input: _code.py, _input.json, and each file under /input/files/'),
        ),
      ),
      v.description('_code.py and _input.json, then the files of input_files and input_artifacts (under /input/files/), by name'),
    ),
    resource_usage: v.nullable(
      v.pipe(v.strictObject({ max_rss_mb: v.pipe(v.number(), v.minValue(0)), cpu_time_ms: nonNegInt, wall_time_ms: nonNegInt }), ref('ResourceUsage')),
    ),
    input_data: v.pipe(
      v.record(v.string(), v.unknown()),
      v.description('The input as submitted, numbers with their exact text (the same value the program read from /input/data.json); input_hash is the SHA-256 of its canonical JSON.'),
    ),
    code_hash: sha256Hex,
    input_hash: sha256Hex,
    parent_execution_id: v.nullable(v.string()),
    relationship: v.pipe(v.nullable(v.picklist(['rerun', 'fork', 'session'])), v.description('rerun or fork of parent_execution_id, or a session\'s cell')),
    session_id: v.optional(v.pipe(v.string(), v.description('A session\'s cell: its session (POST /sessions)'))),
    cell: v.optional(v.pipe(int, v.description('A session\'s cell: its number in the session (1, 2, …)'))),
    stdout_truncated: v.boolean(),
    stderr_truncated: v.boolean(),
    idempotency_key: v.nullable(v.string()),
    timeout: v.pipe(int, v.description('Execution time limit in seconds')),
    startup_timeout: v.pipe(int, v.description('Startup time limit in seconds')),
    requirements: v.array(v.string()),
    correlation_id: v.nullable(v.string()),
    trace_id: v.pipe(
      v.nullable(v.string()),
      v.description('The run\'s OpenTelemetry trace id (32 hex digits): the one of the traceparent the submission carried, or of the trace the service started; also on every log line of the run. Null without a trace.'),
    ),
    callback_url: v.pipe(v.nullable(v.string()), v.description('Where the record is POSTed when the job ends (GET /jobs/{id}/deliveries shows the attempts); null: nowhere')),
  }),
  ref('ExecutionRecordFull', 'SPEC §2.3 execution record with the extended fields (view=full).'),
);

/** A record in either view (`view` decides which). */
export const AnyRecordSchema = v.union([RecordSchema, FullRecordSchema]);

/** SPEC §2.2 sync response, plus `execution_id`. */
export const SyncResultSchema = v.pipe(
  v.strictObject({
    success: v.boolean(),
    output: v.pipe(v.unknown(), v.description('Parsed /output/result.json (numbers with their exact text), or null')),
    stdout: v.string(),
    stderr: v.string(),
    exit_code: v.nullable(int),
    execution_time: v.pipe(v.number(), v.minValue(0), v.description('Wall clock seconds')),
    error: v.nullable(RunErrorSchema),
    job_type: v.string(),
    execution_id: v.string(),
  }),
  ref('SyncResult', 'SPEC §2.2 result of POST /execute; a failure of the code is success=false with status 200.'),
  v.examples([{ success: true, output: null, stdout: '1\n', stderr: '', exit_code: 0, execution_time: 0.04, error: null, job_type: 'default', execution_id: ID_EXAMPLE }]),
);

/** 503 of `POST /execute` with the breaker open: the §2.2 body plus the error fields. */
export const SyncUnavailableSchema = v.pipe(
  v.strictObject({
    ...SyncResultSchema.entries,
    detail: v.string(),
    code: v.literal('service_unavailable'),
    correlation_id: v.string(),
  }),
  ref('SyncUnavailable', 'The circuit breaker is open: the run ended at once with error type service_unavailable.'),
);

/** `POST /execute/async` answer. */
export const SubmissionSchema = v.pipe(
  v.strictObject({
    job_id: v.string(),
    status: v.pipe(queueStatusSchema, v.description('pending for a new job; the current status on an idempotent replay')),
    job_type: v.string(),
    created_at: timestamp,
    idempotency_key: v.nullable(v.string()),
    created: v.pipe(v.boolean(), v.description('false when an idempotency key returned an existing job')),
  }),
  ref('Submission', 'An accepted asynchronous job.'),
  v.examples([{ job_id: ID_EXAMPLE, status: 'pending', job_type: 'default', created_at: TIME_EXAMPLE, idempotency_key: 'order-42', created: true }]),
);

/** `GET /jobs/{id}` brief status. */
export const JobStatusSchema = v.pipe(
  v.strictObject({ job_id: v.string(), status: recordStatus, job_type: v.string(), created_at: timestamp, started_at: nullableTimestamp, ended_at: nullableTimestamp }),
  ref('JobStatus', 'SPEC §4.3 job status.'),
  v.examples([{ job_id: ID_EXAMPLE, status: 'running', job_type: 'default', created_at: TIME_EXAMPLE, started_at: TIME_EXAMPLE, ended_at: null }]),
);

/** 202 of `GET /jobs/{id}/result` while the job is not finished. */
export const NotReadySchema = v.pipe(
  v.strictObject({
    job_id: v.string(),
    status: v.picklist(['pending', 'running']),
    message: v.string(),
    queue_position: v.pipe(nonNegInt, v.description('1-based among queued jobs; 0 when running')),
  }),
  ref('NotReady', 'The job has not finished yet.'),
  v.examples([{ job_id: ID_EXAMPLE, status: 'pending', message: 'job is waiting for a worker (position 3 in the queue)', queue_position: 3 }]),
);

/** `POST /jobs/{id}/cancel` answer. */
export const CancelSchema = v.pipe(
  v.strictObject({
    job_id: v.string(),
    status: v.pipe(v.picklist([...TERMINAL_STATUSES, 'cancelling']), v.description('cancelled; cancelling (202) when the run has not stopped yet; the real status when it finished first')),
    previous_status: queueStatusSchema,
    message: v.string(),
  }),
  ref('CancelResult'),
  v.examples([{ job_id: ID_EXAMPLE, status: 'cancelled', previous_status: 'running', message: 'job cancelled' }]),
);

/** `POST /jobs/{id}/rerun` and `/fork` answer. */
export const LineageSchema = v.pipe(
  v.strictObject({
    job_id: v.string(),
    status: queueStatusSchema,
    parent_execution_id: v.nullable(v.string()),
    relationship: v.nullable(v.picklist(['rerun', 'fork'])),
  }),
  ref('DerivedJob', 'A new job made from a finished one.'),
  v.examples([{ job_id: ID_EXAMPLE, status: 'pending', parent_execution_id: 'b0e4c5d2-1f0a-4c1e-9d7b-2a9f8e7d6c5b', relationship: 'rerun' }]),
);


/** `GET /executions` (either view). */
export const ExecutionsPageSchema = page(AnyRecordSchema, 'ExecutionsPage');


const ERROR_CODES = Object.keys(ERROR_STATUS) as (keyof typeof ERROR_STATUS)[];

const errorBase = {
  detail: v.pipe(v.string(), v.description('What went wrong, for a person')),
  code: v.pipe(v.picklist(ERROR_CODES), v.description('Stable machine-readable code')),
  correlation_id: v.pipe(v.string(), v.description('Also in the X-Correlation-ID header and the logs')),
};

/** The one error body: `{detail, code, correlation_id}` plus the extra facts some errors carry. */
export const ErrorSchema = v.pipe(
  v.strictObject({
    ...errorBase,
    status: v.optional(v.pipe(v.string(), v.description('409 conflict: the job\'s status'))),
    job_id: v.optional(v.string()),
    execution_id: v.optional(v.string()),
    existing_job_id: v.optional(v.string()),
    build: v.optional(v.pipe(v.unknown(), v.description('422 build_failed: the failed build (JobTypeBuild)'))),
    queued: v.optional(nonNegInt),
    running: v.optional(nonNegInt),
    max_queue_size: v.optional(nonNegInt),
  }),
  ref('Error', 'Every error answer.'),
  v.examples([{ detail: 'code: code must be a non-empty string', code: 'validation_error', correlation_id: '0b7e3c9a-61f2-4f3e-a0a4-5a3f7b1c2d3e' }]),
);

/** 409 of an idempotency key reused with another payload (SPEC §7.1). */
export const IdempotencyConflictSchema = v.pipe(
  v.strictObject({ ...errorBase, code: v.literal('idempotency_conflict'), existing_job_id: v.string() }),
  ref('IdempotencyConflict'),
);

/** 408 of a result wait that ran out. */
export const WaitTimeoutSchema = v.pipe(
  v.strictObject({ ...errorBase, code: v.literal('wait_timeout'), job_id: v.string(), status: v.picklist(['pending', 'running']) }),
  ref('WaitTimeout'),
);

/**
 * A JSON answer written with {@link stringifyJson}: numbers of the client's input and the program's
 * result come out exactly as they were read (hono's `c.json` would write them as doubles, or an exact
 * number as an object). Every route whose answer can carry `input_data` or `output` uses it.
 */
export function exactJson(c: Context, value: unknown, status: ContentfulStatusCode = 200): Response {
  return c.body(stringifyJson(value), status, { 'Content-Type': 'application/json' });
}
