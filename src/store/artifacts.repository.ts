/** Artifact metadata and bytes (SPEC §2.5, §4.8). */
import type { Kysely, Transaction } from 'kysely';
import type { ArtifactRow, Database } from './database.ts';

type Q = Kysely<Database> | Transaction<Database>;

/** A new artifact row. */
export interface NewArtifact {
  executionId: string;
  kind: 'output' | 'input';
  name: string;
  sizeBytes: number;
  sha256: string;
  contentType: string;
  data: Buffer | null;
  skipped: string | null;
  /** An input file taken from an earlier job's artifact: that job and artifact name. */
  source?: { executionId: string; name: string } | undefined;
}

const META = ['execution_id', 'kind', 'name', 'size_bytes', 'sha256', 'content_type', 'skipped', 'source_execution_id', 'source_name', 'created_at'] as const;

/** Inserts artifacts (no-op for an empty list). */
export async function insertArtifacts(db: Q, list: NewArtifact[]): Promise<void> {
  if (list.length === 0) return;
  await db
    .insertInto('artifacts')
    .values(
      list.map((a) => ({
        execution_id: a.executionId,
        kind: a.kind,
        name: a.name,
        size_bytes: a.sizeBytes,
        sha256: a.sha256,
        content_type: a.contentType,
        data: a.data,
        skipped: a.skipped,
        source_execution_id: a.source?.executionId ?? null,
        source_name: a.source?.name ?? null,
      })),
    )
    .onConflict((oc) => oc.columns(['execution_id', 'kind', 'name']).doNothing())
    .execute();
}

/** Metadata (no bytes) of one execution's artifacts. */
export async function listArtifacts(db: Q, executionId: string): Promise<Omit<ArtifactRow, 'data'>[]> {
  return db
    .selectFrom('artifacts')
    .select(META)
    .where('execution_id', '=', executionId)
    .orderBy('kind')
    .orderBy('name')
    .execute();
}

/** Metadata of many executions' artifacts, for list views. */
export async function listArtifactsFor(db: Q, ids: string[]): Promise<Omit<ArtifactRow, 'data'>[]> {
  if (ids.length === 0) return [];
  return db
    .selectFrom('artifacts')
    .select(META)
    .where('execution_id', 'in', ids)
    .orderBy('name')
    .execute();
}

/** One artifact with its bytes; kept (not skipped) ones only. */
export async function getArtifact(db: Q, executionId: string, name: string, withData: boolean): Promise<ArtifactRow | undefined> {
  const q = db
    .selectFrom('artifacts')
    .where('execution_id', '=', executionId)
    .where('name', '=', name)
    .where('skipped', 'is', null)
    .orderBy('kind', 'desc'); // 'output' before 'input'; reserved names make them disjoint anyway
  if (withData) return q.selectAll().executeTakeFirst();
  const row = await q.select(META).executeTakeFirst();
  return row ? { ...row, data: null } : undefined;
}

/** The input files of an execution (kind `input`), with their bytes, by name. */
export async function listInputFiles(db: Q, executionId: string): Promise<ArtifactRow[]> {
  return db.selectFrom('artifacts').selectAll().where('execution_id', '=', executionId).where('kind', '=', 'input').orderBy('name').execute();
}
