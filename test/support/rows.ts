/**
 * Rows as other processes leave them in the database, for tests that start from a given state.
 */
import type { NewExecutionRow } from '../../src/store/database.ts';
import { sha256 } from '../../src/util/json.ts';

/** A record left `running` by a holder that is gone, exactly as a killed process leaves it. */
export function orphanRow(id: string, phase: string, code: string, holder: string): NewExecutionRow {
  return {
    id,
    status: 'running',
    mode: 'async',
    job_type: 'default',
    job_version: 'latest',
    job_ref: 'default@sha256:x',
    code,
    input_data: '{}',
    code_hash: sha256(code),
    input_hash: sha256('{}'),
    timeout_s: 30,
    startup_timeout_s: 60,
    requirements: '[]',
    started_at: new Date(),
    heartbeat_at: new Date(),
    claimed_by: holder,
    phase,
    attempts: 1,
  };
}
