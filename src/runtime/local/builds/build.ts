/**
 * Job-type builds on the local runtime (SPEC §4.9, issue #11): the type's requirements are resolved
 * and installed once, with pip in an install sandbox ({@link sandboxInstaller}), into a
 * content-addressed, read-only directory `<instance>/builds/envs/<digest>/`:
 *
 *   site/              what runs mount read-only at `/deps` (on PYTHONPATH)
 *   requirements.lock  pip's hash-checking format: `name==version --hash=sha256:…`, one per line
 *   build.json         digest, python version, base (interpreter identity), runner hash, lock
 *
 * The digest is the sha256 of the canonical JSON of the Python version, the interpreter's identity
 * (implementation, full version, machine, platform — the local "base image"), the runner's sha256 and
 * the lock (every installed distribution with its version and the sha256 of its archive, from pip's
 * `--report`). Same inputs give the same digest; a changed requirement changes the lock.
 *
 * An environment built by another replica (another workspace) is made present here by installing
 * exactly its lock (`--no-deps --require-hashes`) and checking that the digest comes out the same
 * ({@link LocalBuilder.materialize}). Single-flight for that is the in-flight map by digest; the
 * service (jobtypes/builds.ts) owns single-flight of builds themselves.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, lchownSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { BuiltEnvironment, JobType, LockedRequirement } from '../../../jobtypes/job-type.ts';
import { RUNNER_PATH } from '../../../sandbox/paths.ts';
import { canonical, sha256 } from '../../../util/json.ts';
import { BuildFailedError, type Builder, type BuildRequest, type RunObservation, type RunSpec } from '../../runtime.ts';
import { invalidRequirement, normalizeRequirements } from './deps.ts';
import { sandboxInstaller, type InstallContext } from './install-sandbox.ts';
import { SandboxHost } from '../sandbox.ts';

/** Format label inside every digest: a change of the digest's recipe changes every digest. */
const FORMAT = 'sandpod-local-build/1';
const LOCK_FILE = 'requirements.lock';

/** PEP 503 name normalization. */
export function normalizeName(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, '-');
}

/** The lock of a pip `--report` (format 1): every distribution pip installed, sorted by name. */
export function lockFromReport(report: unknown): LockedRequirement[] {
  const install = (report as { install?: unknown })?.install;
  if (!Array.isArray(install)) throw new BuildFailedError('pip wrote no installation report');
  const out: LockedRequirement[] = [];
  for (const item of install as { metadata?: { name?: string; version?: string }; download_info?: { archive_info?: { hash?: string; hashes?: Record<string, string> } } }[]) {
    const name = item.metadata?.name;
    const version = item.metadata?.version;
    if (!name || !version) throw new BuildFailedError('pip reported an installed distribution without name or version');
    const ai = item.download_info?.archive_info;
    const fromHash = ai?.hash?.startsWith('sha256=') ? ai.hash.slice('sha256='.length) : null;
    out.push({ name: normalizeName(name), version, sha256: ai?.hashes?.sha256 ?? fromHash });
  }
  return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** The lock in pip's hash-checking requirements format. */
export function lockFileText(lock: readonly LockedRequirement[]): string {
  return lock.map((l) => `${l.name}==${l.version}${l.sha256 ? ` --hash=sha256:${l.sha256}` : ''}\n`).join('');
}

/** What identifies an interpreter as a base: no paths, no kernel release. */
export interface InterpreterIdentity {
  implementation: string;
  version: string;
  machine: string;
  platform: string;
}

/** The digest of an environment (see the module comment). */
export function environmentDigest(parts: { pythonVersion: string; base: InterpreterIdentity; runnerSha256: string; lock: readonly LockedRequirement[] }): string {
  return sha256(canonical({ format: FORMAT, python_version: parts.pythonVersion, base: parts.base, runner: parts.runnerSha256, lock: parts.lock }));
}

const IDENTITY_PY = 'import json, platform, sys; print(json.dumps({"implementation": sys.implementation.name, "version": platform.python_version(), "machine": platform.machine(), "platform": sys.platform}))';

/** What the started runtime lends a build. */
export interface LocalBuildContext {
  install: InstallContext;
}

/** The local runtime's {@link Builder}. `context()` is null until the runtime has started. */
export class LocalBuilder implements Builder {
  readonly envsDir: string;
  private readonly workRoot: string;
  private readonly runnerSha256: string;
  private readonly identities = new Map<string, InterpreterIdentity>();
  private readonly materializing = new Map<string, Promise<void>>();
  private prepared = false;

  constructor(
    root: string,
    private readonly config: Pick<Config, 'python_interpreters' | 'pip'>,
    private readonly context: () => LocalBuildContext | null,
    private readonly clock: Clock,
  ) {
    this.envsDir = path.join(root, 'envs');
    this.workRoot = path.join(root, 'work');
    this.runnerSha256 = sha256(readFileSync(RUNNER_PATH));
  }

  inputKey(jobType: JobType, requirements: readonly string[]): string {
    const interpreter = this.config.python_interpreters[jobType.pythonVersion] ?? null;
    return sha256(
      canonical({ format: FORMAT, python_version: jobType.pythonVersion, interpreter, pip: this.config.pip, runner: this.runnerSha256, requirements: normalizeRequirements(requirements) }),
    );
  }

  /** The directory runs mount at `/deps`. */
  siteDir(digest: string): string {
    return path.join(this.envsDir, digest, 'site');
  }

  has(env: BuiltEnvironment): boolean {
    return existsSync(path.join(this.envsDir, env.digest, 'build.json'));
  }

  async build(req: BuildRequest): Promise<BuiltEnvironment> {
    const { ctx, interpreter, base } = this.begin(req.jobType.pythonVersion);
    const reqs = normalizeRequirements(req.requirements);
    const bad = invalidRequirement(reqs);
    if (bad) throw new BuildFailedError(bad);
    const work = this.newWorkDir();
    try {
      let lock: LockedRequirement[] = [];
      if (reqs.length > 0) {
        req.onProgress('installing', `pip install ${reqs.join(' ')}`);
        await this.pip(ctx, interpreter, work, reqs, null, req.deadline, req.signal);
        lock = lockFromReport(JSON.parse(readFileSync(path.join(work, 'report.json'), 'utf8')));
      }
      req.onProgress('publishing');
      const env: BuiltEnvironment = {
        digest: environmentDigest({ pythonVersion: req.jobType.pythonVersion, base, runnerSha256: this.runnerSha256, lock }),
        imageRef: '',
        pythonVersion: req.jobType.pythonVersion,
        lock,
      };
      env.imageRef = this.imageRef(env.digest);
      this.publish(work, env, base);
      return env;
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }

  async materialize(env: BuiltEnvironment, deadline: number, signal?: AbortSignal): Promise<void> {
    if (this.has(env)) return;
    let p = this.materializing.get(env.digest);
    if (!p) {
      p = this.reproduce(env, deadline, signal).finally(() => this.materializing.delete(env.digest));
      this.materializing.set(env.digest, p);
    }
    return p;
  }

  private async reproduce(env: BuiltEnvironment, deadline: number, signal?: AbortSignal): Promise<void> {
    const { ctx, interpreter, base } = this.begin(env.pythonVersion);
    if (env.lock.some((l) => !l.sha256)) throw new BuildFailedError(`environment ${env.digest} has lock entries without a hash; rebuild the job type here`);
    const work = this.newWorkDir();
    try {
      let lock: LockedRequirement[] = [];
      if (env.lock.length > 0) {
        writeFileSync(path.join(work, LOCK_FILE), lockFileText(env.lock), { mode: 0o644 });
        await this.pip(ctx, interpreter, work, [], LOCK_FILE, deadline, signal);
        lock = lockFromReport(JSON.parse(readFileSync(path.join(work, 'report.json'), 'utf8')));
      }
      const digest = environmentDigest({ pythonVersion: env.pythonVersion, base, runnerSha256: this.runnerSha256, lock });
      if (digest !== env.digest) {
        throw new BuildFailedError(`installing the lock of ${env.digest} here gives ${digest} (another interpreter or runner); rebuild the job type`);
      }
      this.publish(work, env, base);
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }

  /**
   * The environment's name in the API: content-addressed, no host path (issue 22: a client has no
   * business knowing where the workspace is). No `@sha256:` in it: it is not an image a cluster could pull.
   */
  private imageRef(digest: string): string {
    return `local:sha256:${digest}`;
  }

  private begin(pythonVersion: string): { ctx: LocalBuildContext; interpreter: string; base: InterpreterIdentity } {
    const ctx = this.context();
    if (!ctx) throw new BuildFailedError('the local runtime is not started');
    const interpreter = this.config.python_interpreters[pythonVersion];
    if (!interpreter) throw new BuildFailedError(`no interpreter configured for python ${pythonVersion} (python_interpreters)`);
    if (!this.prepared) {
      mkdirSync(this.envsDir, { recursive: true, mode: 0o755 });
      // Work directories of a crashed process are garbage.
      rmSync(this.workRoot, { recursive: true, force: true });
      mkdirSync(this.workRoot, { recursive: true, mode: 0o755 });
      this.prepared = true;
    }
    return { ctx, interpreter, base: this.identity(interpreter) };
  }

  private identity(interpreter: string): InterpreterIdentity {
    let id = this.identities.get(interpreter);
    if (!id) {
      try {
        id = JSON.parse(execFileSync(interpreter, ['-I', '-c', IDENTITY_PY], { encoding: 'utf8', timeout: 30_000 })) as InterpreterIdentity;
      } catch (err) {
        throw new BuildFailedError(`cannot ask ${interpreter} who it is: ${(err as Error).message}`);
      }
      this.identities.set(interpreter, id);
    }
    return id;
  }

  private newWorkDir(): string {
    const work = path.join(this.workRoot, `${this.clock.now()}-${randomBytes(4).toString('hex')}`);
    mkdirSync(path.join(work, 'site'), { recursive: true, mode: 0o755 });
    SandboxHost.ownBySandbox(work);
    SandboxHost.ownBySandbox(path.join(work, 'site'));
    return work;
  }

  /** pip in an install sandbox: `reqs`, or exactly the lock file `lockFile` in `work`. */
  private async pip(ctx: LocalBuildContext, interpreter: string, work: string, reqs: string[], lockFile: string | null, deadline: number, signal?: AbortSignal): Promise<void> {
    const install = sandboxInstaller(ctx.install, interpreter, { workDir: work, report: true, ...(lockFile ? { lockFile } : {}) });
    const out = await install(path.join(work, 'site'), reqs, deadline, signal);
    if (out.cancelled) throw new BuildFailedError('the build was cancelled');
    if (out.timedOut) throw new BuildFailedError('the build did not finish in time');
    if (!out.ok) throw new BuildFailedError(out.output || 'pip failed without output');
  }

  /** Writes the lock and build.json, makes everything read-only (root-owned as root) and renames it into place. */
  private publish(work: string, env: BuiltEnvironment, base: InterpreterIdentity): void {
    rmSync(path.join(work, 'report.json'), { force: true });
    writeFileSync(path.join(work, LOCK_FILE), lockFileText(env.lock));
    writeFileSync(
      path.join(work, 'build.json'),
      `${JSON.stringify({ format: FORMAT, digest: env.digest, python_version: env.pythonVersion, base, runner_sha256: this.runnerSha256, lock: env.lock }, null, 2)}\n`,
    );
    readOnly(work);
    const dest = path.join(this.envsDir, env.digest);
    try {
      renameSync(work, dest);
    } catch (err) {
      // Content-addressed: an environment already there under this digest is the same one.
      if (!existsSync(dest)) throw err;
    }
  }
}

/** Root-owned (when root) and not writable by anyone: a published environment never changes. */
function readOnly(dir: string): void {
  const root = process.getuid?.() === 0;
  const entries = [dir, ...(readdirSync(dir, { recursive: true }) as string[]).map((rel) => path.join(dir, rel))];
  for (const p of entries.reverse()) {
    const st = lstatSync(p);
    if (root) lchownSync(p, 0, 0);
    if (st.isSymbolicLink()) continue;
    chmodSync(p, st.isDirectory() ? 0o555 : st.mode & 0o555);
  }
}

/** Sorted, de-duplicated requirements are the same set. */
export function sameRequirements(a: readonly string[], b: readonly string[]): boolean {
  const x = normalizeRequirements(a);
  const y = normalizeRequirements(b);
  return x.length === y.length && x.every((r, i) => r === y[i]);
}

/** What {@link builtEnvironmentStep} decided for a run's requirements. */
export type BuiltStep =
  | { handled: false }
  | { handled: true; depsDir: string | null; installMs: number; end?: Partial<RunObservation> };

/**
 * The run's requirements step when builds are involved: a run of a built type asking for nothing
 * beyond the type's requirements mounts the pinned environment (present here, or reproduced from its
 * lock when another replica built it); in `production_mode` a run that would install at start is
 * refused with `config_error`. Otherwise the caller installs as before (`handled: false`).
 */
export async function builtEnvironmentStep(
  builder: LocalBuilder,
  config: Pick<Config, 'production_mode'>,
  spec: Pick<RunSpec, 'jobType' | 'requirements'>,
  clock: Clock,
  deadline: number,
  signal?: AbortSignal,
): Promise<BuiltStep> {
  const jt = spec.jobType;
  if (jt.build && sameRequirements(spec.requirements, jt.requirements)) {
    const t0 = clock.now();
    if (!builder.has(jt.build)) {
      try {
        await builder.materialize(jt.build, deadline, signal);
      } catch (err) {
        const installMs = clock.now() - t0;
        if (signal?.aborted) return { handled: true, depsDir: null, installMs, end: { cancelled: true } };
        if (clock.now() >= deadline) return { handled: true, depsDir: null, installMs, end: { timedOut: 'startup' } };
        return { handled: true, depsDir: null, installMs, end: { dependencyError: (err as Error).message } };
      }
      return { handled: true, depsDir: builder.siteDir(jt.build.digest), installMs: clock.now() - t0 };
    }
    return { handled: true, depsDir: builder.siteDir(jt.build.digest), installMs: 0 };
  }
  if (config.production_mode && normalizeRequirements(spec.requirements).length > 0) {
    return { handled: true, depsDir: null, installMs: 0, end: { infraError: { type: 'config_error', message: productionModeMessage(jt.name, !!jt.build) } } };
  }
  return { handled: false };
}

/** Why production mode refuses a run that would install requirements at start, and what to do. */
export function productionModeMessage(jobType: string, built: boolean): string {
  return built
    ? `production_mode: requirements beyond job type '${jobType}''s own are not installed at run time; add them to the job type and build it (POST /job-types/${jobType}/build)`
    : `production_mode: job type '${jobType}' has requirements but no built environment; build it first with POST /job-types/${jobType}/build`;
}
