/** Picks the job type registry: JobType resources with the Kubernetes runtime, the config file otherwise. */
import type { Config } from '../config.ts';
import type { Logger } from '../logger.ts';
import { FileJobTypeRegistry, type JobTypeRegistry } from './job-type.ts';

/** What {@link createJobTypeRegistry} needs from the service. */
export interface JobTypeRegistryDeps {
  logger: Logger;
}

/** Creates the configured registry; a cluster registry must be `start()`ed before use. */
export async function createJobTypeRegistry(config: Config, deps: JobTypeRegistryDeps): Promise<JobTypeRegistry> {
  if (config.runtime === 'kubernetes' && config.kubernetes.watch_job_types) {
    const { KubernetesJobTypeRegistry } = await import('./kubernetes-registry.ts');
    return new KubernetesJobTypeRegistry(config, { logger: deps.logger });
  }
  return new FileJobTypeRegistry(config);
}
