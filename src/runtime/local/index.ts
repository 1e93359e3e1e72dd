/** The local runtime: gVisor, bubblewrap or plain-process sandboxes on this machine. */
export { createLocalRuntime, type LocalRuntime, type LocalRuntimeOptions } from './local-runtime.ts';
export { detectEngines, measureBareFloor, type BareFloorOptions, type EngineDetection } from './engine-probe.ts';
export { candidateEngines, ENGINE_ORDER, type EngineName } from './engines.ts';
export { EXECUTION_GRACE_MS } from './runs/proc.ts';
export { programEnv } from './runs/runner-command.ts';
export { instanceRoot } from './workspace.ts';
export { MAX_ARTIFACT_ENTRIES } from '../run-output.ts';
