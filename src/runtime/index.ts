/** Picks the runtime the configuration names. */
import type { Config } from '../config.ts';
import type { Logger } from '../logger.ts';
import type { Guard, Runtime, RuntimeHooks } from './runtime.ts';

/** Creates the configured runtime (`local` or `kubernetes`). */
export async function createRuntime(config: Config, deps: { logger: Logger; guard: Guard; hooks: RuntimeHooks }): Promise<Runtime> {
  if (config.runtime === 'kubernetes') {
    const { createKubernetesRuntime } = await import('./kubernetes/index.ts');
    return createKubernetesRuntime(config, { guard: deps.guard, hooks: deps.hooks, logger: deps.logger });
  }
  const { createLocalRuntime } = await import('./local/index.ts');
  return createLocalRuntime(config, { logger: deps.logger });
}
