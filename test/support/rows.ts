/**
 * Rows as other processes leave them in the database, for tests that start from a given state.
 */
import type { NewExecutionRow } from '../../src/store/database.ts';
import { sha256 } from '../../src/util/json.ts';

/**
 * A new record with every column a test does not care about filled in: queued, async, job type
 * `default`, `print(1)` with `{}` as input, created now. `extra` sets (or overrides) the rest.
 */
export function newRow(id: string, extra: Partial<NewExecutionRow> = {}): NewExecutionRow {
  return {
    id,
    status: 'queued',
    mode: 'async',
    job_type: 'default',
    job_version: 'latest',
    job_ref: 'default@latest',
    code: 'print(1)',
    input_data: '{}',
    code_hash: 'h',
    input_hash: 'h',
    timeout_s: 30,
    startup_timeout_s: 60,
    requirements: '[]',
    created_at: new Date(),
    ...extra,
  };
}

/** A record left `running` by a holder that is gone, exactly as a killed process leaves it. */
export function orphanRow(id: string, phase: string, code: string, holder: string): NewExecutionRow {
  return newRow(id, {
    status: 'running',
    job_ref: 'default@sha256:x',
    code,
    code_hash: sha256(code),
    input_hash: sha256('{}'),
    started_at: new Date(),
    heartbeat_at: new Date(),
    claimed_by: holder,
    phase,
    attempts: 1,
  });
}
