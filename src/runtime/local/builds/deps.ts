/**
 * Requirement environments (SPEC §1.8): one directory per (interpreter, sorted requirements, pip
 * settings), installed once with `pip install --target` inside an install sandbox of the run's engine
 * (install-sandbox.ts) and then mounted read-only at `/deps` (on PYTHONPATH) in every run that
 * asks for the same set. {@link prepareRequirements} is the run's startup step that gets one.
 *
 * Concurrency: within one process, runs asking for the same environment share one install (the map of
 * in-flight installs is the lock). Across processes, each installs into a private temporary directory
 * and publishes it with an atomic rename; a loser of that race throws its copy away and uses the
 * winner's. A published directory is complete by construction.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, lchownSync, mkdirSync, readdirSync, renameSync, rmSync } from 'node:fs';
import path from 'node:path';
import { systemClock, type Clock } from '../../../clock.ts';
import type { RunObservation } from '../../runtime.ts';

/** What the install step reports. */
export interface InstallOutcome {
  ok: boolean;
  /** pip's combined output (tail), for the dependency error. */
  output: string;
  /** Ended because the startup deadline passed. */
  timedOut: boolean;
  cancelled: boolean;
}

/** Result of asking for an environment. */
export type DepsResult =
  | { kind: 'ready'; dir: string; installMs: number; cached: boolean }
  | { kind: 'failed'; message: string; installMs: number }
  | { kind: 'timeout'; installMs: number }
  | { kind: 'cancelled'; installMs: number };

/** Runs pip for `requirements` into `target` (a fresh directory owned by the sandbox user). */
export type Installer = (target: string, requirements: string[], deadline: number, signal?: AbortSignal) => Promise<InstallOutcome>;

/** Normalizes requirements: trimmed, de-duplicated, sorted (the cache key is order-insensitive). */
export function normalizeRequirements(reqs: readonly string[]): string[] {
  return [...new Set(reqs.map((r) => r.trim()).filter(Boolean))].sort();
}

/** Rejects requirement strings that pip would read as options (`-r /etc/…`, `--index-url …`). */
export function invalidRequirement(reqs: readonly string[]): string | null {
  for (const r of reqs) {
    if (r.startsWith('-')) return `requirement ${JSON.stringify(r)} looks like a pip option`;
    if (/[\0\n\r]/.test(r)) return `requirement ${JSON.stringify(r)} contains a control character`;
  }
  return null;
}

/** The cache key of an environment. */
export function depsKey(interpreter: string, pythonVersion: string, reqs: readonly string[], pipSettings: unknown): string {
  return createHash('sha256').update(JSON.stringify({ interpreter, pythonVersion, reqs, pipSettings })).digest('hex').slice(0, 32);
}

/** The environment cache of one runtime instance. */
export class DepsCache {
  private readonly inflight = new Map<string, Promise<DepsResult>>();
  readonly envsDir: string;
  readonly buildDir: string;

  constructor(
    root: string,
    private readonly makeOwned: (dir: string) => void,
    private readonly clock: Clock = systemClock,
  ) {
    this.envsDir = path.join(root, 'envs');
    this.buildDir = path.join(root, 'build');
    for (const d of [this.envsDir, this.buildDir]) mkdirSync(d, { recursive: true, mode: 0o755 });
    // Earlier versions shared one pip cache, writable by every install, between all installs: what is
    // in it may have been planted by a package (issue 22). Installs no longer use a shared cache.
    rmSync(path.join(root, 'pip-cache'), { recursive: true, force: true });
    // Half-built environments of a crashed process are garbage.
    rmSync(this.buildDir, { recursive: true, force: true });
    mkdirSync(this.buildDir, { recursive: true, mode: 0o755 });
  }

  /**
   * Returns the environment for `key`, installing it with `install` when it does not exist yet.
   * `deadline` (epoch ms) bounds this caller's wait; a timed-out or cancelled install of another caller
   * is retried while this caller still has time.
   */
  async ensure(key: string, reqs: string[], install: Installer, deadline: number, signal?: AbortSignal): Promise<DepsResult> {
    const t0 = this.clock.now();
    const dir = path.join(this.envsDir, key);
    for (;;) {
      if (existsSync(dir)) return { kind: 'ready', dir, installMs: this.clock.now() - t0, cached: this.clock.now() - t0 < 5 };
      if (signal?.aborted) return { kind: 'cancelled', installMs: this.clock.now() - t0 };
      if (this.clock.now() >= deadline) return { kind: 'timeout', installMs: this.clock.now() - t0 };
      let p = this.inflight.get(key);
      const mine = !p;
      if (!p) {
        p = this.build(key, dir, reqs, install, deadline, signal).finally(() => this.inflight.delete(key));
        this.inflight.set(key, p);
      }
      const r = mine ? await p : await raceDeadline(p, deadline, this.clock, signal);
      if (r === 'deadline') return { kind: 'timeout', installMs: this.clock.now() - t0 };
      if (r === 'aborted') return { kind: 'cancelled', installMs: this.clock.now() - t0 };
      if (r.kind === 'ready' || r.kind === 'failed' || mine) return { ...r, installMs: this.clock.now() - t0 } as DepsResult;
      // Someone else's install was cut short by *their* deadline or cancel: try again ourselves.
    }
  }

  private async build(key: string, dir: string, reqs: string[], install: Installer, deadline: number, signal?: AbortSignal): Promise<DepsResult> {
    const t0 = this.clock.now();
    const tmp = path.join(this.buildDir, `${key}-${randomBytes(4).toString('hex')}`);
    mkdirSync(tmp, { mode: 0o755 });
    this.makeOwned(tmp);
    try {
      const out = await install(tmp, reqs, deadline, signal);
      const installMs = this.clock.now() - t0;
      if (out.cancelled) return { kind: 'cancelled', installMs };
      if (out.timedOut) return { kind: 'timeout', installMs };
      if (!out.ok) return { kind: 'failed', message: out.output, installMs };
      // pip ran as the sandbox user; the published environment must not stay writable by that uid.
      if (process.getuid?.() === 0) {
        lchownSync(tmp, 0, 0);
        for (const rel of readdirSync(tmp, { recursive: true }) as string[]) lchownSync(path.join(tmp, rel), 0, 0);
      }
      try {
        renameSync(tmp, dir);
      } catch (err) {
        // Another process published the same environment first: use theirs.
        if (!existsSync(dir)) throw err;
      }
      return { kind: 'ready', dir, installMs, cached: false };
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  }
}

function raceDeadline<T>(p: Promise<T>, deadline: number, clock: Clock, signal?: AbortSignal): Promise<T | 'deadline' | 'aborted'> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => done('deadline'), Math.max(0, deadline - clock.now()));
    const onAbort = () => done('aborted');
    signal?.addEventListener('abort', onAbort, { once: true });
    function done(v: T | 'deadline' | 'aborted') {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      resolve(v);
    }
    p.then(done, (err: unknown) => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      reject(err);
    });
  });
}

/** The outcome of a run's requirements step: a `/deps` directory (or none), or how the run ends. */
export type RequirementsOutcome =
  | { depsDir: string | null; installMs: number; end?: undefined }
  | { depsDir?: undefined; installMs: number; end: Partial<RunObservation> };

/**
 * The startup step of a run with `requirements`: refuses option-like ones, then gets the environment
 * from the cache (installing it with `install` when needed) before `deadline`. No requirements → no
 * `/deps`. When the run must end here, `end` holds what the observation says (dependency error,
 * startup timeout, cancel).
 */
export async function prepareRequirements(
  cache: DepsCache,
  requirements: readonly string[],
  key: { interpreter: string; pythonVersion: string; pip: unknown },
  install: Installer,
  deadline: number,
  signal?: AbortSignal,
): Promise<RequirementsOutcome> {
  const reqs = normalizeRequirements(requirements);
  if (reqs.length === 0) return { depsDir: null, installMs: 0 };
  const bad = invalidRequirement(reqs);
  if (bad) return { installMs: 0, end: { dependencyError: bad } };
  const r = await cache.ensure(depsKey(key.interpreter, key.pythonVersion, reqs, key.pip), reqs, install, deadline, signal);
  if (r.kind === 'cancelled') return { installMs: r.installMs, end: { cancelled: true } };
  if (r.kind === 'timeout') return { installMs: r.installMs, end: { timedOut: 'startup' } };
  if (r.kind === 'failed') return { installMs: r.installMs, end: { dependencyError: r.message || 'pip failed without output' } };
  return { depsDir: r.dir, installMs: r.installMs };
}
