/** Picks the job type registry: JobType resources with the Kubernetes runtime, the config file otherwise. */
import type { Config } from '../config.ts';
import type { Logger } from '../logger.ts';
import type { Guard } from '../runtime/runtime.ts';
import { FileJobTypeRegistry, type JobTypeRegistry } from './job-type.ts';

/** Creates the configured registry; a cluster registry must be `start()`ed before use. */
export async function createJobTypeRegistry(config: Config, deps: { guard: Guard; logger: Logger }): Promise<JobTypeRegistry> {
  if (config.runtime === 'kubernetes' && config.kubernetes.watch_job_types) {
    const { KubernetesJobTypeRegistry } = await import('./kubernetes-registry.ts');
    return new KubernetesJobTypeRegistry(config, { guard: deps.guard, logger: deps.logger });
  }
  return new FileJobTypeRegistry(config);
}
