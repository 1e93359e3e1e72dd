/**
 * Job-type builds (SPEC §4.9, issue #11), runtime-independent: `POST /job-types/{name}/build` comes
 * here; the runtime's {@link Builder} does the building (local: a content-addressed environment; a
 * cluster builder plugs in behind the same interface).
 *
 * - **One build per inputs.** Concurrent builds of a type's same inputs (requirements, interpreter or
 *   base, pip settings, runner: {@link Builder.inputKey}) share one: in this process through the
 *   in-flight map, across replicas through the `building` row, whose partial unique index admits one
 *   at a time. A replica that loses the insert follows the winner's row and answers with its result
 *   (making the environment present locally from its lock). A holder renews its lease while building;
 *   a lease older than `builds.lease_seconds` belongs to a crashed replica and is expired.
 * - **Following a build.** Each build is a record (`GET /job-types/{name}/builds/{id}`) whose `phase`
 *   moves `queued` → `installing` → `publishing` → `built` (or `failed`).
 * - **Pinning.** This class is also the job type registry the service uses: it overlays each type with
 *   its current build (the newest `built` one whose inputs match the type as configured now), so a new
 *   record's `job_version`/`job_ref` name that build, and {@link pinned} gives a run the build its
 *   record names, even after a rebuild.
 */
import { randomUUID } from 'node:crypto';
import type { Clock } from '../clock.ts';
import { AppError, errorMessage } from '../errors.ts';
import { silentLogger, type Logger } from '../logger.ts';
import type { Builder } from '../runtime/runtime.ts';
import { buildingOf, builtBuilds, expireStaleBuild, finishBuild, getBuild, insertBuilding, listBuilds, updateBuildPhase } from '../store/builds.repository.ts';
import type { Db, JobTypeBuildRow } from '../store/database.ts';
import type { JobType, JobTypeBuild, JobTypeRegistry, LockedRequirement } from './job-type.ts';

/** NOTIFY channel: a replica finished a build; the others reload their pin index. */
export const BUILDS_CHANNEL = 'sandpod_job_type_builds';

/**
 * A semantic version: the regular expression semver.org 2.0.0 publishes for its grammar (no leading
 * `v`). Kept here instead of the `semver` package, which is not a dependency, for one test.
 */
export const SEMVER_RE =
  /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$/;

/** 400 unless `tag` is null or a semantic version. */
export function checkVersionTag(tag: string | null): void {
  if (tag !== null && !SEMVER_RE.test(tag)) {
    throw new AppError('validation_error', `version_tag: must be a semantic version such as 1.2.0 or 2.0.0-rc.1, got ${JSON.stringify(tag)}`);
  }
}

/** The API view of a build (`POST /job-types/{name}/build`, `GET /job-types/{name}/builds/{id}`). */
export interface BuildView {
  id: string;
  status: 'building' | 'built' | 'failed';
  job_type: string;
  /** `<job_type>@sha256:<digest>` once built. */
  version: string | null;
  digest: string | null;
  image_ref: string | null;
  /** The label runs record as `job_version`: the tag, or `latest`. */
  version_tag: string | null;
  phase: string;
  python_version: string;
  /** The job type's requirements as asked. */
  requirements: string[];
  /** What was resolved and installed: every distribution with its version and archive sha256. */
  resolved_requirements: LockedRequirement[] | null;
  duration_ms: number | null;
  error: string | null;
  created_at: string;
  finished_at: string | null;
}

/** How a local build's `image_ref` was stored before issue 22: `local:` and the environment's directory. */
const LEGACY_LOCAL_REF = /^local:\/.*\/([0-9a-f]{64})$/;

/**
 * An `image_ref` as clients see it: a local environment as `local:sha256:<digest>`, also for rows
 * stored with the host directory by an earlier version; images as they are.
 */
export function publicImageRef(ref: string | null): string | null {
  const legacy = ref === null ? null : LEGACY_LOCAL_REF.exec(ref);
  return legacy ? `local:sha256:${legacy[1]}` : ref;
}

/** The view of a build row. */
export function buildView(r: JobTypeBuildRow): BuildView {
  return {
    id: r.id,
    status: r.status as BuildView['status'],
    job_type: r.job_type,
    version: r.digest ? `${r.job_type}@sha256:${r.digest}` : null,
    digest: r.digest,
    image_ref: publicImageRef(r.image_ref),
    version_tag: r.version_tag,
    phase: r.phase,
    python_version: r.python_version,
    requirements: r.requirements,
    resolved_requirements: r.lock,
    duration_ms: r.duration_ms,
    error: r.error,
    created_at: new Date(r.created_at).toISOString(),
    finished_at: r.finished_at ? new Date(r.finished_at).toISOString() : null,
  };
}

/** Options of {@link JobTypeBuilds}. */
export interface JobTypeBuildsOptions {
  db: Db;
  /** The configured job types (file or cluster registry). */
  base: JobTypeRegistry;
  /** The runtime's builder; null where builds are not supported (then `build` answers 501). */
  builder: Builder | null;
  clock: Clock;
  logger?: Logger;
  /** This process, as a lease holder. */
  owner: string;
  timeoutMs: number;
  leaseMs: number;
  /** How often a follower looks at another replica's build. */
  pollMs?: number;
}

/** A started (or joined) build. */
export interface BuildHandle {
  id: string;
  done: Promise<JobTypeBuildRow>;
}

/** See the module comment. */
export class JobTypeBuilds implements JobTypeRegistry {
  private readonly inflight = new Map<string, Promise<BuildHandle>>();
  /** `built` rows by job type, oldest first. */
  private built = new Map<string, JobTypeBuildRow[]>();
  private unlisten: (() => Promise<void>) | null = null;
  private readonly log: Logger;
  private readonly pollMs: number;
  private readonly running = new Set<Promise<unknown>>();
  /** Aborted by stop(): builds in progress end (failed, "cancelled") instead of holding up shutdown. */
  private readonly stopping = new AbortController();

  constructor(private readonly o: JobTypeBuildsOptions) {
    this.log = o.logger ?? silentLogger;
    this.pollMs = o.pollMs ?? 500;
  }

  /** True when the runtime can build. */
  get supported(): boolean {
    return this.o.builder !== null;
  }

  async start(): Promise<void> {
    await this.o.base.start?.();
    if (!this.o.builder) return;
    this.unlisten = await this.o.db.listen(BUILDS_CHANNEL, () => void this.reload().catch((err: unknown) => this.log.warn({ err }, 'reloading job-type builds failed')));
    await this.reload();
  }

  async stop(): Promise<void> {
    this.stopping.abort();
    await this.unlisten?.();
    this.unlisten = null;
    await Promise.allSettled([...this.running]);
    await this.o.base.stop?.();
  }

  /** Re-reads the finished builds (the pin index). */
  async reload(): Promise<void> {
    const next = new Map<string, JobTypeBuildRow[]>();
    for (const r of await builtBuilds(this.o.db.kysely)) {
      let list = next.get(r.job_type);
      if (!list) next.set(r.job_type, (list = []));
      list.push(r);
    }
    this.built = next;
  }

  // ── registry ────────────────────────────────────────────────────────────────────────────────

  get(name: string): JobType | undefined {
    const jt = this.o.base.get(name);
    return jt && this.overlay(jt, this.currentBuild(jt));
  }

  list(): JobType[] {
    return this.o.base.list().map((jt) => this.overlay(jt, this.currentBuild(jt)));
  }

  pinned(name: string, jobRef: string): JobType | undefined {
    const jt = this.o.base.get(name);
    if (!jt) return undefined;
    const digest = /@sha256:([0-9a-f]{64})$/.exec(jobRef)?.[1];
    const rows = this.built.get(name) ?? [];
    for (let i = rows.length - 1; i >= 0; i--) if (rows[i]!.digest === digest) return this.overlay(jt, rows[i]!);
    // Pinned to no build (an unbuilt type's spec digest): the type as configured, without a build.
    return jt;
  }

  /** The newest build whose inputs are the type's as configured now. */
  private currentBuild(jt: JobType): JobTypeBuildRow | null {
    const rows = this.built.get(jt.name);
    if (!rows || !this.o.builder) return null;
    const key = this.o.builder.inputKey(jt, jt.requirements);
    for (let i = rows.length - 1; i >= 0; i--) if (rows[i]!.input_key === key) return rows[i]!;
    return null;
  }

  private overlay(jt: JobType, row: JobTypeBuildRow | null): JobType {
    if (!row || !row.digest || !row.image_ref) return jt;
    const build: JobTypeBuild = {
      id: row.id,
      digest: row.digest,
      imageRef: publicImageRef(row.image_ref)!,
      pythonVersion: row.python_version,
      lock: row.lock ?? [],
      version: row.version_tag ?? 'latest',
      builtAt: new Date(row.finished_at ?? row.created_at),
    };
    // The build's own requirements: a run pinned to an older build gets what that build installed.
    return { ...jt, requirements: [...row.requirements], version: build.version, digest: build.digest, build };
  }

  // ── builds ──────────────────────────────────────────────────────────────────────────────────

  /**
   * Starts a build of `name` (or joins the one building the same inputs). `versionTag` must be a
   * semantic version. Throws 404 for an unknown type, 400 for a bad tag, 501 without a builder.
   */
  async build(name: string, versionTag: string | null): Promise<BuildHandle> {
    checkVersionTag(versionTag);
    const jt = this.o.base.get(name);
    if (!jt) throw new AppError('not_found', `job type '${name}' not found`);
    const builder = this.o.builder;
    if (!builder) throw new AppError('not_implemented', `job-type builds are not implemented for this runtime yet; requirements are installed at run time and cached`);
    const inputKey = builder.inputKey(jt, jt.requirements);
    const flight = `${name}\0${inputKey}`;
    let h = this.inflight.get(flight);
    if (!h) {
      h = this.lease(jt, builder, inputKey, versionTag);
      this.inflight.set(flight, h);
      const clear = () => this.inflight.delete(flight);
      h.then((x) => x.done.then(clear, clear), clear);
    }
    return h;
  }

  /** One build record by id (404 when there is none for that type). */
  async getBuild(name: string, id: string): Promise<JobTypeBuildRow> {
    if (!this.o.base.get(name)) throw new AppError('not_found', `job type '${name}' not found`);
    const row = await getBuild(this.o.db.kysely, name, id);
    if (!row) throw new AppError('not_found', `build '${id}' of job type '${name}' not found`);
    return row;
  }

  /** A type's builds, newest first. */
  async listBuilds(name: string, limit = 50): Promise<JobTypeBuildRow[]> {
    if (!this.o.base.get(name)) throw new AppError('not_found', `job type '${name}' not found`);
    return listBuilds(this.o.db.kysely, name, limit);
  }

  /** Takes the lease and builds, or follows the replica that holds it. */
  private async lease(jt: JobType, builder: Builder, inputKey: string, versionTag: string | null): Promise<BuildHandle> {
    const db = this.o.db.kysely;
    for (let attempt = 0; ; attempt++) {
      const now = new Date(this.o.clock.now());
      const row = await insertBuilding(db, {
        id: randomUUID(),
        jobType: jt.name,
        inputKey,
        versionTag,
        requirements: jt.requirements,
        pythonVersion: jt.pythonVersion,
        owner: this.o.owner,
        now,
      });
      if (row) return { id: row.id, done: this.track(this.execute(row, jt, builder)) };
      const other = await buildingOf(db, jt.name, inputKey);
      if (!other) {
        if (attempt > 20) throw new Error(`could not take or find the build lease of job type '${jt.name}'`);
        continue; // finished between our insert and our look: try again
      }
      if (await expireStaleBuild(db, other.id, new Date(now.getTime() - this.o.leaseMs), now)) {
        this.log.warn({ job_type: jt.name, build_id: other.id, owner: other.owner }, 'took over a build whose replica stopped');
        continue;
      }
      return { id: other.id, done: this.track(this.follow(other.id, jt.name, builder)) };
    }
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.running.add(p);
    const drop = () => this.running.delete(p);
    p.then(drop, drop);
    return p;
  }

  /** Runs the build this process holds the lease of, renewing the lease with each phase and a timer. */
  private async execute(row: JobTypeBuildRow, jt: JobType, builder: Builder): Promise<JobTypeBuildRow> {
    const db = this.o.db.kysely;
    const t0 = this.o.clock.now();
    let phase = 'queued';
    const setPhase = (p: string) => {
      phase = p;
      void updateBuildPhase(db, row.id, this.o.owner, p, new Date(this.o.clock.now())).catch((err: unknown) => this.log.warn({ err: errorMessage(err) }, 'recording build progress failed'));
    };
    const renew = setInterval(() => setPhase(phase), Math.max(1000, Math.floor(this.o.leaseMs / 3)));
    renew.unref();
    const log = this.log.child({ job_type: jt.name, build_id: row.id });
    log.info({ requirements: jt.requirements }, 'job-type build started');
    let end: Parameters<typeof finishBuild>[3];
    try {
      const env = await builder.build({ jobType: jt, requirements: jt.requirements, onProgress: (p) => setPhase(p), deadline: t0 + this.o.timeoutMs, signal: this.stopping.signal });
      end = { status: 'built', digest: env.digest, imageRef: env.imageRef, lock: env.lock, now: new Date(this.o.clock.now()), durationMs: this.o.clock.now() - t0 };
      log.info({ digest: env.digest, duration_ms: end.durationMs }, 'job-type build done');
    } catch (err) {
      end = { status: 'failed', error: errorMessage(err), now: new Date(this.o.clock.now()), durationMs: this.o.clock.now() - t0 };
      log.warn({ error: end.error }, 'job-type build failed');
    } finally {
      clearInterval(renew);
    }
    const done = await finishBuild(db, row.id, this.o.owner, end);
    if (!done) throw new Error(`build ${row.id} of job type '${jt.name}' lost its lease before it finished`);
    await this.reload();
    await this.o.db.notify(BUILDS_CHANNEL, row.id).catch(() => {});
    return done;
  }

  /** Waits for another replica's build; when it succeeded, makes its environment present here. */
  private async follow(id: string, name: string, builder: Builder): Promise<JobTypeBuildRow> {
    const db = this.o.db.kysely;
    for (;;) {
      const row = await getBuild(db, name, id);
      if (!row) throw new Error(`build ${id} disappeared`);
      if (row.status === 'building') {
        const now = this.o.clock.now();
        if (await expireStaleBuild(db, id, new Date(now - this.o.leaseMs), new Date(now))) continue;
        if (this.stopping.signal.aborted) throw new AppError('shutting_down', 'service is shutting down; the build goes on on its replica');
        await new Promise((r) => setTimeout(r, this.pollMs));
        continue;
      }
      if (row.status === 'built' && row.digest && row.image_ref) {
        try {
          await builder.materialize({ digest: row.digest, imageRef: row.image_ref, pythonVersion: row.python_version, lock: row.lock ?? [] }, this.o.clock.now() + this.o.timeoutMs, this.stopping.signal);
        } catch (err) {
          throw new AppError('build_failed', `job type '${name}' was built by another replica, but installing its lock here failed: ${errorMessage(err)}`, { build: buildView(row) });
        }
        await this.reload();
      }
      return row;
    }
  }
}
