/** Bulk history rows for index and pagination tests (generate_series: fast at any size). */
import { sql, type Kysely } from 'kysely';

/** Inserts `n` finished executions spread over statuses and job types, newest last. */
export async function seedHistory(db: Kysely<any>, n: number): Promise<void> {
  await sql`
    INSERT INTO executions (id, status, mode, job_type, job_version, job_ref, code, input_data, code_hash, input_hash,
                            timeout_s, startup_timeout_s, requirements, created_at, started_at, ended_at, duration_ms, exit_code, stdout, stderr)
    SELECT 'seed-' || g, (ARRAY['succeeded','failed','timeout','oom','cancelled'])[1 + g % 5], 'async',
           (ARRAY['default','data','http'])[1 + g % 3], 'latest', 'default@sha256:0', 'print(1)', '{}'::json, 'h', 'h',
           30, 60, '[]'::json, now() - (${n} - g) * interval '1 millisecond', now(), now(), 1, 0, to_json('1\n'::text), to_json(''::text)
    FROM generate_series(1, ${n}) g`.execute(db);
  await sql`ANALYZE executions`.execute(db);
}
