/** Picks the runtime the configuration names. */
import type { Config } from '../config.ts';
import type { JobType } from '../jobtypes/job-type.ts';
import type { Logger } from '../logger.ts';
import type { Runtime, RuntimeHooks } from './runtime.ts';

/** What {@link createRuntime} needs from the service. */
export interface RuntimeDeps {
  logger: Logger;
  /** Lets the Kubernetes runtime tell orphaned Jobs from live ones at start. */
  hooks: RuntimeHooks;
  /** The job types there are now (the Kubernetes runtime keeps a warm pool per type). */
  jobTypes?: () => JobType[];
}

/** Creates the configured runtime (`local` or `kubernetes`). */
export async function createRuntime(config: Config, deps: RuntimeDeps): Promise<Runtime> {
  if (config.runtime === 'kubernetes') {
    const { createKubernetesRuntime } = await import('./kubernetes/index.ts');
    return createKubernetesRuntime(config, { hooks: deps.hooks, logger: deps.logger, ...(deps.jobTypes ? { jobTypes: deps.jobTypes } : {}) });
  }
  const { createLocalRuntime } = await import('./local/index.ts');
  return createLocalRuntime(config, { logger: deps.logger });
}
