/**
 * A run on a claimed warm sandbox (pool/sandbox-pool.ts): the program and input are in its run
 * directory already; the go line goes down its stdin; from the runner's `execution` marker the run is
 * supervised as a cold one, and its `done` line ends it: the cgroup is stopped, the output collected,
 * and the sandbox destroyed in the background (the engine's teardown is not waited for).
 */
import { runEnv, type RawRun, type RunObservation, type RunOptions, type RunSpec } from '../../runtime.ts';
import type { WarmSandbox } from '../pool/sandbox-pool.ts';
import { collectRun } from './collect.ts';
import { superviseLaunch } from './proc.ts';
import type { Prepared, RunContext, RunState } from './run-state.ts';
import { finish, observe } from './steps.ts';

/** How long after a warm run its sandbox's teardown and the pool's refill wait (see runWarm), ms. */
const WARM_TEARDOWN_DELAY_MS = 10;

/**
 * Runs `spec` on `w`. `teardowns` holds the pending teardowns (the runtime's stop runs them at once).
 */
export async function runWarm(
  ctx: RunContext,
  teardowns: Set<() => void>,
  spec: RunSpec,
  options: RunOptions,
  p: Prepared,
  t0: number,
  obs: RunObservation,
  w: WarmSandbox,
): Promise<RawRun> {
  const s: RunState = { spec, options, p, interpreter: '', t0, obs, rd: w.rd, depsDir: null, egress: null, warm: null, cgroup: w.cgroup };
  try {
    obs.warm = true;
    w.bind(spec.executionId);
    w.go(spec.timeoutSec, spec.maxStdoutBytes, runEnv(spec));
    const res = await superviseLaunch(null, {
      clock: ctx.clock,
      startupDeadline: t0 + spec.startupTimeoutSec * 1000,
      timeoutMs: spec.timeoutSec * 1000,
      signal: options.signal,
      onExecution: () => {
        obs.phase = 'execution';
        options.onPhase?.('execution');
      },
      kill: () => w.cgroup.killAll(),
      started: w.proc,
      doneMarker: true,
      framed: true,
      onOutput: options.onOutput,
    });
    // Stopped, not killed: the sandbox's teardown waits (below) until the run is recorded.
    observe(ctx.clock, s, res, 'stop');
    // The cgroup's counter includes the sandbox's own start, before the claim.
    if (obs.cpuTimeMs !== undefined) obs.cpuTimeMs = Math.max(0, obs.cpuTimeMs - w.cpuBeforeMs);
    return finish(ctx.clock, obs, t0, {}, collectRun(w.rd.outputDir, res, obs, spec));
  } finally {
    // The teardown and the refill start a moment later: both take CPU (process kills, cgroup and
    // directory removal, a new sandbox's start) that the run's record and answer would otherwise
    // wait for on a small machine. The sandbox's processes were its program's; its outputs are in.
    const teardown = () => {
      clearTimeout(later);
      teardowns.delete(teardown);
      ctx.background(w.destroy());
      p.sandboxes?.tick();
    };
    const later = setTimeout(teardown, WARM_TEARDOWN_DELAY_MS);
    teardowns.add(teardown);
  }
}
