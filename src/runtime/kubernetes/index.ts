/** The Kubernetes runtime: see `kubernetes-runtime.ts`. */
export { createKubernetesRuntime, RUNNER_PATH, type KubernetesRuntimeOptions } from './kubernetes-runtime.ts';
export { buildJob, ownSecret, type RunObjects, type BuildJobOptions } from './runs/build-job.ts';
export { decide, type Action, type RunState } from './runs/decide.ts';
