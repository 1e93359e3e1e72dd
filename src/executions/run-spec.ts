/** What the runtime is asked to run for a record: the {@link RunSpec} of a record and its input files. */
import type { Config } from '../config.ts';
import { pinnedJobType, type JobTypeRegistry } from '../jobtypes/job-type.ts';
import type { RawRun, RunOptions, RunSpec } from '../runtime/runtime.ts';
import type { ExecutionRow } from '../store/database.ts';
import type { InputFile } from './input-files.ts';
import { mergedRequirements, resolveJobType } from './requests.ts';
import { inputJsonOf } from './views.ts';

/** Runs a record somewhere else than a fresh sandbox of the runtime's (a session's cell, issue 19). */
export type CellRunner = (spec: RunSpec, options: RunOptions) => Promise<RawRun>;

/** Options of `Running.execute`: adoption, early release of the slot, known input files, a cell's runner. */
export interface ExecuteOptions {
  adopt?: boolean;
  release?: () => void;
  files?: InputFile[];
  runner?: CellRunner;
}

/** The fields of a record a run spec is made of. */
export type SpecRow = Pick<ExecutionRow, 'id' | 'code' | 'input_data' | 'job_type' | 'job_ref' | 'timeout_s' | 'startup_timeout_s' | 'requirements'>;

/** The spec of a record's run: the build it pinned (even after a rebuild: issue #11), its input files, its trace. */
export function specOf(config: Config, registry: JobTypeRegistry, row: SpecRow, files: readonly InputFile[], traceparent?: string): RunSpec {
  const jt = pinnedJobType(registry, row.job_type, row.job_ref) ?? resolveJobType(registry, row.job_type);
  return {
    executionId: row.id,
    code: row.code,
    inputJson: inputJsonOf(row),
    ...(files.length > 0 ? { inputFiles: files.map((f) => ({ name: f.name, data: f.data, sha256: f.sha256 })) } : {}),
    jobType: jt,
    timeoutSec: row.timeout_s,
    startupTimeoutSec: row.startup_timeout_s,
    requirements: mergedRequirements(jt, row.requirements),
    maxStdoutBytes: config.max_stdout_bytes,
    maxArtifactBytes: config.max_artifact_bytes,
    ...(traceparent ? { traceparent } : {}),
  };
}
