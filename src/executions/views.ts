/**
 * Wire shapes of execution records (SPEC §2.2, §2.3, §2.5, §4.3). One mapper per shape; the extended
 * fields appear only with `view=full`. Spelling: the primary field names of §2.3 (not the alternative
 * `content_hashes` / `cpu_time_seconds` spelling).
 */
import { canonical } from '../util/json.ts';
import type { ArtifactRow, ExecutionRow } from '../store/database.ts';
import type { BriefRow } from '../store/executions.repository.ts';

/** SPEC §2.5 artifact metadata. */
export interface ArtifactView {
  name: string;
  size_bytes: number;
  sha256: string;
  content_type: string;
  /** Present when the file was not kept (`too_large`, `reserved_name`, `not_regular`). */
  skipped?: string;
}

type ArtifactMeta = Omit<ArtifactRow, 'data'>;

const iso = (d: unknown): string | null => (d === null || d === undefined ? null : new Date(d as string).toISOString());

/** SPEC §2.3 record without the extended fields (what {@link BriefRow} holds). */
export function briefView(row: BriefRow): Record<string, unknown> {
  return {
    execution_id: row.id,
    job_id: row.id,
    status: row.status,
    job_type: row.job_type,
    job_version: row.job_version,
    created_at: iso(row.created_at),
    started_at: iso(row.started_at),
    ended_at: iso(row.ended_at),
    duration_ms: row.duration_ms,
    exit_code: row.exit_code,
    stdout: row.stdout ?? '',
    stderr: row.stderr ?? '',
    output: row.output ?? null,
    error: row.error ?? null,
    timing: row.timing ?? null,
  };
}

/** SPEC §2.3 record; `full` adds the extended fields. */
export function recordView(row: ExecutionRow, full: boolean, artifacts: ArtifactMeta[] = []): Record<string, unknown> {
  const base = briefView(row);
  if (!full) return base;
  const output = artifacts.filter((a) => a.kind === 'output');
  return {
    ...base,
    job_ref: row.job_ref,
    artifacts: output.map(artifactView),
    // A record from before the count was kept lists everything it knew of.
    artifacts_total: row.artifacts_total ?? output.length,
    artifacts_truncated: row.artifacts_truncated ?? false,
    input_artifacts: [...inputArtifacts(row), ...artifacts.filter((a) => a.kind === 'input').map(inputFileView)],
    resource_usage: row.resource_usage ?? null,
    input_data: row.input_data,
    code_hash: row.code_hash,
    input_hash: row.input_hash,
    parent_execution_id: row.parent_execution_id,
    relationship: row.relationship,
    // A session's cell (issue 19): its session and number.
    ...(row.session_id ? { session_id: row.session_id, cell: row.cell } : {}),
    stdout_truncated: row.stdout_truncated,
    stderr_truncated: row.stderr_truncated,
    // A key taken over by a resubmission (its job failed before its code started) still shows here.
    idempotency_key: row.idempotency_key ?? row.retired_idempotency_key,
    timeout: row.timeout_s,
    startup_timeout: row.startup_timeout_s,
    requirements: row.requirements,
    correlation_id: row.correlation_id,
    trace_id: row.trace_id ?? null,
    callback_url: row.callback_url ?? null,
  };
}

/** SPEC §2.2 sync response. */
export function syncView(row: ExecutionRow): Record<string, unknown> {
  const ms = row.duration_ms ?? 0;
  return {
    success: row.status === 'succeeded',
    output: row.output ?? null,
    stdout: row.stdout ?? '',
    stderr: row.stderr ?? '',
    exit_code: row.exit_code,
    execution_time: Math.round(ms) / 1000,
    error: row.error ?? null,
    job_type: row.job_type,
    execution_id: row.id,
  };
}

/** SPEC §2.5 view of a stored artifact row. */
export function artifactView(a: ArtifactMeta): ArtifactView {
  return {
    name: a.name,
    size_bytes: Number(a.size_bytes),
    sha256: a.sha256,
    content_type: a.content_type,
    ...(a.skipped ? { skipped: a.skipped } : {}),
  };
}

/** The input artifacts `_code.py` and `_input.json`, served from the record itself (no second copy). */
export function inputArtifactFiles(row: ExecutionRow): { view: ArtifactView; data: Buffer }[] {
  const code = Buffer.from(row.code, 'utf8');
  const input = Buffer.from(inputJsonOf(row), 'utf8');
  return [
    { view: { name: '_code.py', size_bytes: code.length, sha256: row.code_hash, content_type: 'text/x-python; charset=utf-8' }, data: code },
    { view: { name: '_input.json', size_bytes: input.length, sha256: row.input_hash, content_type: 'application/json' }, data: input },
  ];
}

/**
 * An input file (`/input/files/<name>`) as the record lists it: SPEC §2.5 metadata, its path in the
 * sandbox, and for one taken from an earlier job's artifact, which.
 */
export function inputFileView(a: ArtifactMeta): ArtifactView & { path: string; source?: { job_id: string; name: string } } {
  return {
    ...artifactView(a),
    path: `/input/files/${a.name}`,
    ...(a.source_execution_id ? { source: { job_id: a.source_execution_id, name: a.source_name ?? a.name } } : {}),
  };
}

function inputArtifacts(row: ExecutionRow): ArtifactView[] {
  return inputArtifactFiles(row).map((f) => f.view);
}

/** The exact `/input/data.json` text of a record: canonical JSON of `input_data` (its hash is `input_hash`). */
export function inputJsonOf(row: Pick<ExecutionRow, 'input_data'>): string {
  return canonical(row.input_data);
}
