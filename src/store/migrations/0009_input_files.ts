import type { Kysely } from 'kysely';

/**
 * Files for one-shot runs (issue 19): `input_files` and `input_artifacts` of a submission are kept as
 * `artifacts` rows of kind `input` (bytes included, so a rerun or fork has them even after the job they
 * came from is gone) and placed read-only under `/input/files/` in the sandbox.
 *
 * - `executions.input_files`: how many such files the record has, so a run without any never reads
 *   the artifacts table before it starts.
 * - `artifacts.source_execution_id`, `artifacts.source_name`: for a file taken by reference from an
 *   earlier job's artifact (`input_artifacts`), which one it was.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema
    .alterTable('executions')
    .addColumn('input_files', 'integer', (c) => c.notNull().defaultTo(0))
    .execute();
  await db.schema.alterTable('artifacts').addColumn('source_execution_id', 'text').addColumn('source_name', 'text').execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('artifacts').dropColumn('source_execution_id').dropColumn('source_name').execute();
  await db.schema.alterTable('executions').dropColumn('input_files').execute();
}
