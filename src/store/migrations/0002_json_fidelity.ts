import { sql, type Kysely } from 'kysely';

/**
 * Fidelity of what clients send and programs print (issue #9).
 *
 * `jsonb` refuses the escape `\u0000` and lone surrogates such as `\ud800`, both valid JSON that
 * clients send and programs write, so those records failed with a 500 or an `internal_error`. The
 * `json` type keeps the text exactly as written (escapes included) and still checks its syntax; we
 * never query inside these columns, so nothing is lost by leaving `jsonb`.
 *
 * `text` cannot hold a NUL byte, which programs print: stdout and stderr become `json` holding one
 * JSON string, so NUL is stored as the escape `\u0000` and read back as the character.
 */
export async function up(db: Kysely<any>): Promise<void> {
  for (const column of ['input_data', 'requirements', 'output', 'error', 'timing', 'resource_usage']) {
    await sql`ALTER TABLE executions ALTER COLUMN ${sql.ref(column)} TYPE json USING ${sql.ref(column)}::json`.execute(db);
  }
  for (const column of ['stdout', 'stderr']) {
    await sql`ALTER TABLE executions ALTER COLUMN ${sql.ref(column)} TYPE json USING to_json(${sql.ref(column)})`.execute(db);
  }
  await sql`ALTER TABLE dlq ALTER COLUMN job_data TYPE json USING job_data::json`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`ALTER TABLE dlq ALTER COLUMN job_data TYPE jsonb USING job_data::jsonb`.execute(db);
  for (const column of ['stdout', 'stderr']) {
    await sql`ALTER TABLE executions ALTER COLUMN ${sql.ref(column)} TYPE text USING ${sql.ref(column)} #>> '{}'`.execute(db);
  }
  for (const column of ['input_data', 'requirements', 'output', 'error', 'timing', 'resource_usage']) {
    await sql`ALTER TABLE executions ALTER COLUMN ${sql.ref(column)} TYPE jsonb USING ${sql.ref(column)}::jsonb`.execute(db);
  }
}
