/** A real runtime with its `run` replaced (to count calls or inject an engine failure); the rest delegates. */
import type { Runtime } from '../../src/runtime/runtime.ts';

export function withRun(r: Runtime, run: Runtime['run']): Runtime {
  return {
    name: r.name,
    start: () => r.start(),
    stop: () => r.stop(),
    health: () => r.health(),
    run,
  };
}
