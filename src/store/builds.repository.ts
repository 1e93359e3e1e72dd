/**
 * Job-type build records (migration 0003): the `building` row is a lease — the partial unique index
 * lets one build of a job type's inputs run at a time across every replica — and `built` rows are
 * the environments runs pin to. Plain functions taking a kysely handle first, like the other
 * repositories.
 */
import type { Database, JobTypeBuildRow } from './database.ts';
import type { Q } from './executions.repository.ts';

/** What a new build row needs. */
export interface NewBuild {
  id: string;
  jobType: string;
  inputKey: string;
  versionTag: string | null;
  requirements: string[];
  pythonVersion: string;
  owner: string;
  now: Date;
}

/**
 * Takes the lease of a build of (`job_type`, `input_key`): inserts a `building` row, or returns null
 * when another one is building those inputs already (the unique index settles the race).
 */
export async function insertBuilding(db: Q, b: NewBuild): Promise<JobTypeBuildRow | null> {
  const row = await db
    .insertInto('job_type_builds')
    .values({
      id: b.id,
      job_type: b.jobType,
      input_key: b.inputKey,
      status: 'building',
      version_tag: b.versionTag,
      requirements: JSON.stringify(b.requirements),
      python_version: b.pythonVersion,
      phase: 'queued',
      owner: b.owner,
      heartbeat_at: b.now,
      created_at: b.now,
    })
    .onConflict((oc) => oc.columns(['job_type', 'input_key']).where('status', '=', 'building').doNothing())
    .returningAll()
    .executeTakeFirst();
  return row ?? null;
}

/** The build of those inputs now holding the lease, if any. */
export async function buildingOf(db: Q, jobType: string, inputKey: string): Promise<JobTypeBuildRow | undefined> {
  return db.selectFrom('job_type_builds').selectAll().where('job_type', '=', jobType).where('input_key', '=', inputKey).where('status', '=', 'building').executeTakeFirst();
}

/** One build by id (and job type). */
export async function getBuild(db: Q, jobType: string, id: string): Promise<JobTypeBuildRow | undefined> {
  return db.selectFrom('job_type_builds').selectAll().where('id', '=', id).where('job_type', '=', jobType).executeTakeFirst();
}

/** A job type's builds, newest first. */
export async function listBuilds(db: Q, jobType: string, limit: number): Promise<JobTypeBuildRow[]> {
  return db.selectFrom('job_type_builds').selectAll().where('job_type', '=', jobType).orderBy('created_at', 'desc').orderBy('id', 'desc').limit(limit).execute();
}

/** Every finished (`built`) build, oldest first: the pin index is rebuilt from them. */
export async function builtBuilds(db: Q): Promise<JobTypeBuildRow[]> {
  return db.selectFrom('job_type_builds').selectAll().where('status', '=', 'built').orderBy('finished_at', 'asc').orderBy('id', 'asc').execute();
}

/** Records progress of a build this owner holds (and renews its lease). False when the lease is gone. */
export async function updateBuildPhase(db: Q, id: string, owner: string, phase: string, now: Date): Promise<boolean> {
  const r = await db.updateTable('job_type_builds').set({ phase, heartbeat_at: now }).where('id', '=', id).where('owner', '=', owner).where('status', '=', 'building').executeTakeFirst();
  return Number(r.numUpdatedRows) === 1;
}

/** Ends a build this owner holds: `built` with its environment, or `failed` with the builder's message. */
export async function finishBuild(
  db: Q,
  id: string,
  owner: string,
  end: { status: 'built'; digest: string; imageRef: string; lock: unknown; now: Date; durationMs: number } | { status: 'failed'; error: string; now: Date; durationMs: number },
): Promise<JobTypeBuildRow | undefined> {
  const set: Partial<Record<keyof Database['job_type_builds'], unknown>> =
    end.status === 'built'
      ? { status: 'built', phase: 'built', digest: end.digest, image_ref: end.imageRef, lock: JSON.stringify(end.lock), finished_at: end.now, heartbeat_at: end.now, duration_ms: end.durationMs }
      : { status: 'failed', phase: 'failed', error: end.error, finished_at: end.now, heartbeat_at: end.now, duration_ms: end.durationMs };
  return db
    .updateTable('job_type_builds')
    .set(set as never)
    .where('id', '=', id)
    .where('owner', '=', owner)
    .where('status', '=', 'building')
    .returningAll()
    .executeTakeFirst();
}

/** Fails a `building` row whose holder stopped renewing its lease before `staleBefore` (a crashed replica). */
export async function expireStaleBuild(db: Q, id: string, staleBefore: Date, now: Date): Promise<boolean> {
  const r = await db
    .updateTable('job_type_builds')
    .set({ status: 'failed', phase: 'failed', error: 'the replica building it stopped (lease expired)', finished_at: now })
    .where('id', '=', id)
    .where('status', '=', 'building')
    .where('heartbeat_at', '<', staleBefore)
    .executeTakeFirst();
  return Number(r.numUpdatedRows) === 1;
}
