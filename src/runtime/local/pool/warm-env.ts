/**
 * What a warm sandbox is made from, as one key: the job type's shape (limits, network, environment
 * variables, preload), the interpreter, and the environment mounted at `/deps`. A run claims only a
 * sandbox whose key is its own, so a sandbox started for one environment or one network never serves
 * a run of another.
 *
 * The environment ({@link WarmEnv}) is one of: none (no requirements), a job type's built
 * environment (by its digest, builds/build.ts), or a cached install of a run's requirements (by its
 * cache key, builds/deps.ts). {@link warmEnvFor} finds it without installing anything: a run whose
 * environment is not there yet (first install, a build not materialized) starts cold, and that cold
 * start leaves it cached for the next run.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { Config } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import { sameRequirements, type LocalBuilder } from '../builds/build.ts';
import { depsKey, invalidRequirement, normalizeRequirements } from '../builds/deps.ts';

/** The environment a warm sandbox mounts at `/deps`: `id` names it in the pool key; `dir` is null for none. */
export interface WarmEnv {
  id: string;
  dir: string | null;
}

/** No requirements: nothing at `/deps`. */
export const NO_ENV: WarmEnv = { id: 'none', dir: null };

/** What {@link warmEnvFor} looks in. */
export interface WarmEnvSources {
  config: Pick<Config, 'production_mode' | 'pip'>;
  builder: Pick<LocalBuilder, 'has' | 'siteDir'>;
  /** The requirement environments' directory (DepsCache.envsDir). */
  envsDir: string;
}

/**
 * The environment a run of `jobType` with `requirements` (the job type's and the run's own) would
 * mount, when it exists now; null when the run must start cold (its environment is to be installed
 * or materialized, or the run is refused: bad requirements, production_mode).
 */
export function warmEnvFor(src: WarmEnvSources, jobType: JobType, requirements: readonly string[], interpreter: string): WarmEnv | null {
  const reqs = normalizeRequirements(requirements);
  if (reqs.length === 0) return NO_ENV;
  const jt = jobType;
  if (jt.build && sameRequirements(requirements, jt.requirements)) {
    return src.builder.has(jt.build) ? { id: `build:${jt.build.digest}`, dir: src.builder.siteDir(jt.build.digest) } : null;
  }
  if (src.config.production_mode || invalidRequirement(reqs)) return null;
  const key = depsKey(interpreter, jt.pythonVersion, reqs, src.config.pip);
  const dir = path.join(src.envsDir, key);
  return existsSync(dir) ? { id: `deps:${key}`, dir } : null;
}

/**
 * The key of a pool: the job type's name and everything of it a sandbox is made from (limits,
 * network, environment variables, preload), the interpreter and the environment. Not the spec digest
 * alone: a run's job type must match the sandbox's in every field that shaped it, whoever built the
 * JobType object.
 */
export function poolKey(jobType: JobType, interpreter: string, env: WarmEnv = NO_ENV): string {
  const jt = jobType;
  const shape = [jt.pythonVersion, jt.memoryLimit, jt.cpuLimit, jt.maxProcesses, jt.maxFileSize, jt.network, Object.entries(jt.env).sort(), jt.preload, interpreter, env.id];
  return `${jt.name}:${createHash('sha256').update(JSON.stringify(shape)).digest('hex').slice(0, 16)}`;
}

/** Whether a job type's runs reach the network only through the egress proxy (allowed_hosts). */
export function usesEgressProxy(jobType: JobType): boolean {
  return jobType.network.mode === 'bridge' && jobType.network.allowedHosts.length > 0;
}
