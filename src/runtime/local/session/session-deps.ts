/**
 * The environment a local session's cells find at `/deps` (issue 19): the job type's built
 * environment when the session asks for exactly its requirements, else the requirements installed
 * (or found cached) exactly as a one-shot run's are (builds/deps.ts), shared with runs asking for the
 * same set. A failure is the caller's to fix: {@link SessionDependencyError} with pip's words.
 */
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import { type RunObservation } from '../../runtime.ts';
import { SessionDependencyError } from '../../session.ts';
import { builtEnvironmentStep, type LocalBuilder } from '../builds/build.ts';
import { prepareRequirements, type DepsCache, type Installer } from '../builds/deps.ts';

/** What {@link sessionDeps} needs of the local runtime. */
export interface SessionDepsContext {
  builder: LocalBuilder;
  config: Pick<Config, 'production_mode' | 'pip'>;
  clock: Clock;
  deps: DepsCache;
  install: Installer;
  interpreter: string;
}

/** The host directory to mount at `/deps`, or null without requirements; throws when it cannot be had. */
export async function sessionDeps(c: SessionDepsContext, jobType: JobType, requirements: readonly string[], deadline: number): Promise<string | null> {
  if (requirements.length === 0) return null;
  const spec = { jobType, requirements: [...requirements] };
  const built = await builtEnvironmentStep(c.builder, c.config, spec, c.clock, deadline);
  const key = { interpreter: c.interpreter, pythonVersion: jobType.pythonVersion, pip: c.config.pip };
  const r = built.handled ? built : await prepareRequirements(c.deps, requirements, key, c.install, deadline);
  if (r.end) throw endError(r.end);
  return r.depsDir;
}

function endError(end: Partial<RunObservation>): Error {
  if (end.dependencyError) return new SessionDependencyError(end.dependencyError);
  if (end.infraError?.type === 'config_error') return new SessionDependencyError(end.infraError.message);
  if (end.timedOut) return new Error('installing its requirements took longer than a session may take to start');
  return new Error(end.infraError?.message ?? 'its requirements could not be prepared');
}
