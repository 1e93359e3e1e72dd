/**
 * The tables' shapes as kysely sees them (one interface a table) and the row types the code uses.
 * The connection (PostgreSQL or PGlite) is database.ts, which re-exports these.
 */
import type { ColumnType, Generated, Insertable, Selectable, Updateable } from 'kysely';

type Timestamp = ColumnType<Date, Date | string, Date | string>;
type GeneratedTimestamp = ColumnType<Date, Date | string | undefined, Date | string>;
type Json<T = unknown> = ColumnType<T, string, string>;

/** Execution records (SPEC §2.3, every field including the extended view) and the durable queue. */
export interface ExecutionsTable {
  id: string;
  status: string;
  /** `sync` (POST /execute) or `async` (the queue). */
  mode: string;
  job_type: string;
  job_version: string;
  job_ref: string;
  code: string;
  input_data: Json;
  code_hash: string;
  input_hash: string;
  timeout_s: number;
  startup_timeout_s: number;
  requirements: Json<string[]>;
  idempotency_key: string | null;
  /** sha256 of the canonical submission payload, compared on idempotent re-submission. */
  payload_hash: string | null;
  parent_execution_id: string | null;
  relationship: string | null;
  created_at: GeneratedTimestamp;
  started_at: Timestamp | null;
  ended_at: Timestamp | null;
  duration_ms: number | null;
  exit_code: number | null;
  /** A JSON string (the `json` type keeps NUL as `\u0000`; `text` cannot hold it). */
  stdout: Json<string> | null;
  stderr: Json<string> | null;
  stdout_truncated: Generated<boolean>;
  stderr_truncated: Generated<boolean>;
  /** Entries the program left in `/output` (listed or not); null for records from before it was counted. */
  artifacts_total: number | null;
  /** `/output` held more entries than the record lists. */
  artifacts_truncated: Generated<boolean>;
  output: Json | null;
  error: Json | null;
  timing: Json | null;
  resource_usage: Json | null;
  /** Phase the run reached: `startup` until user code began, then `execution`. */
  phase: string | null;
  /** Worker (process) holding the run, for crash recovery. */
  claimed_by: string | null;
  heartbeat_at: Timestamp | null;
  cancel_requested: Generated<boolean>;
  attempts: Generated<number>;
  /** A queued job given back after an infrastructure fault is not claimed before this time. */
  run_after: Timestamp | null;
  /** Infrastructure failures of this job before its code started (each one gave it back to the queue). */
  infra_failures: Generated<number>;
  /** Ended `failed` by an infrastructure error before its code started: its idempotency key may be reused. */
  failed_before_start: Generated<boolean>;
  /** The key of a job whose key was taken over by a resubmission (see `failed_before_start`). */
  retired_idempotency_key: string | null;
  /** How many files the run gets under `/input/files/` (artifacts of kind `input`). */
  input_files: Generated<number>;
  /** A session's cell (issue 19): its session and its number there (1, 2, …); `relationship` is `session`. */
  session_id: string | null;
  cell: number | null;
  client_ip: string | null;
  correlation_id: string | null;
  /** W3C traceparent the run's trace continues (migration 0008); null without a trace. */
  traceparent: string | null;
  /** The trace id of `traceparent`, for the record and the logs. */
  trace_id: string | null;
  /** Where the record is POSTed when it ends (issue 21); null: nowhere. */
  callback_url: string | null;
}

/** Artifact metadata and bytes (SPEC §2.5); `kind` is `output` or `input`. */
export interface ArtifactsTable {
  execution_id: string;
  kind: string;
  name: string;
  size_bytes: number;
  sha256: string;
  content_type: string;
  /** Null when the file was not kept (`skipped` says why). */
  data: Buffer | null;
  skipped: string | null;
  /** An input file taken from an earlier job's artifact (`input_artifacts`): that job and name. */
  source_execution_id: Generated<string | null>;
  source_name: Generated<string | null>;
  created_at: GeneratedTimestamp;
}

/** The dead letter queue (SPEC §2.9). */
export interface DlqTable {
  id: Generated<number>;
  job_id: string;
  job_data: Json;
  error_type: string;
  error_message: string;
  retry_count: number;
  created_at: GeneratedTimestamp;
  client_ip: string | null;
  correlation_id: string | null;
}

/** Job-type builds (SPEC §4.9): the lease of a running build and the record of a finished one. */
export interface JobTypeBuildsTable {
  id: string;
  job_type: string;
  input_key: string;
  /** `building`, `built` or `failed`. */
  status: string;
  version_tag: string | null;
  requirements: Json<string[]>;
  python_version: string;
  /** Progress: `queued`, `resolving`, `installing`, `publishing`, `built`, `failed`. */
  phase: string;
  digest: string | null;
  image_ref: string | null;
  lock: Json<{ name: string; version: string; sha256: string | null }[]> | null;
  error: string | null;
  owner: string;
  heartbeat_at: Timestamp;
  created_at: Timestamp;
  finished_at: Timestamp | null;
  duration_ms: number | null;
}

/** Run events (`GET /jobs/{id}/events`): phase changes and output chunks, per run in `id` order. */
export interface ExecutionEventsTable {
  id: Generated<number>;
  execution_id: string;
  /** The SSE event name: `status`, `stdout`, `stderr`, `truncated`. */
  kind: string;
  /** The event's data, a JSON text. */
  data: Json;
  created_at: GeneratedTimestamp;
}

/** The webhook outbox (migration 0007): one row per ended record with a callback. */
export interface WebhookDeliveriesTable {
  id: string;
  execution_id: string;
  url: string;
  status: Generated<string>;
  attempts: Generated<number>;
  next_attempt_at: Timestamp | null;
  first_attempt_at: Timestamp | null;
  lease_until: Timestamp | null;
  claimed_by: string | null;
  last_status_code: number | null;
  last_error: string | null;
  created_at: GeneratedTimestamp;
  ended_at: Timestamp | null;
}

/** One delivery attempt (`GET /jobs/{id}/deliveries`). */
export interface WebhookAttemptsTable {
  id: Generated<number>;
  delivery_id: string;
  attempt: number;
  started_at: Timestamp;
  duration_ms: number;
  status_code: number | null;
  error: string | null;
  outcome: string;
}

/** Sessions (issue 19): one row per session; its cells are execution records. */
export interface SessionsTable {
  id: string;
  /** `starting`, `ready`, `busy`, `ended`. */
  status: string;
  /** `closed`, `idle`, `lifetime`, `oom`, `crashed`, `service_restart`; null while live. */
  end_reason: string | null;
  job_type: string;
  idle_timeout_s: number;
  max_lifetime_s: number;
  cell_timeout_s: number;
  cells: Generated<number>;
  running_cell_id: string | null;
  /** The process whose sandbox it is (`Executions.workerId`) and its last sign of life. */
  owner: string;
  heartbeat_at: Timestamp;
  created_at: GeneratedTimestamp;
  last_used_at: Timestamp;
  ended_at: Timestamp | null;
  client_ip: string | null;
  correlation_id: string | null;
  /** The session's own requirements as a JSON array (a process that adopts the session needs them); null on older rows. */
  requirements: string | null;
  /** A live replica that asked the holder to let the session go (Kubernetes hand-over); null otherwise. */
  handoff_to: string | null;
  /** Its sandbox came ready from the runtime's session pool (set once it started). */
  warm: Generated<boolean>;
}

/** A holder's liveness lease (src/queue/leases.ts): renewed on the database's clock. */
export interface HolderLeasesTable {
  holder: string;
  expires_at: Timestamp;
  renewed_at: GeneratedTimestamp;
}

/** All tables. */
export interface Database {
  holder_leases: HolderLeasesTable;
  sessions: SessionsTable;
  executions: ExecutionsTable;
  artifacts: ArtifactsTable;
  dlq: DlqTable;
  job_type_builds: JobTypeBuildsTable;
  execution_events: ExecutionEventsTable;
  webhook_deliveries: WebhookDeliveriesTable;
  webhook_attempts: WebhookAttemptsTable;
}

export type ExecutionRow = Selectable<ExecutionsTable>;
export type NewExecutionRow = Insertable<ExecutionsTable>;
export type ExecutionUpdate = Updateable<ExecutionsTable>;
export type ArtifactRow = Selectable<ArtifactsTable>;
export type DlqRow = Selectable<DlqTable>;
export type SessionRow = Selectable<SessionsTable>;
export type JobTypeBuildRow = Selectable<JobTypeBuildsTable>;
