/** The local runtime: gVisor, bubblewrap or plain-process sandboxes on this machine. */
export {
  createLocalRuntime,
  detectEngines,
  measureBareFloor,
  instanceRoot,
  programEnv,
  RUNNER_SOURCE,
  RUNNER_TIMEOUT_EXIT,
  RUNNER_ERROR_EXIT,
  EXECUTION_GRACE_MS,
  type LocalRuntime,
  type LocalRuntimeOptions,
  type LocalRuntimeLogger,
  type BareFloorOptions,
  type EngineDetection,
} from './local-runtime.ts';
export { candidateEngines, ENGINE_ORDER, type EngineName } from './engines.ts';
export { contentTypeFor, MAX_ARTIFACT_ENTRIES } from './collect.ts';
