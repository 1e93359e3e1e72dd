/**
 * Sandbox suites run once per real engine (and, with {@link describeEachEngineAndMode}, once per way
 * of getting a sandbox: cold or warm). Where an engine is missing they skip visibly, except in
 * CI (`CI=true`), which installs both: there a missing engine is a failure, not a silent skip.
 */
import { describe, expect, it } from 'vitest';
import { engineInstalled, findEngineBinaries } from '../../src/runtime/local/engines.ts';
import type { LocalRuntime } from '../../src/runtime/local/index.ts';
import type { RawRun, RunOptions, RunSpec } from '../../src/runtime/runtime.ts';

/** The real engines the sandbox suites cover. */
export const REAL_ENGINES = ['gvisor', 'bubblewrap'] as const;

/** `describe.each` over the real engines, with the presence check above; `body` gets the engine. */
export function describeEachEngine(title: string, body: (engine: (typeof REAL_ENGINES)[number]) => void): void {
  describe.each(REAL_ENGINES)(title, (engine) => {
    const installed = engineInstalled(engine, findEngineBinaries({ container_runtime: 'runsc' }));
    if (!installed && process.env.CI === 'true') {
      it(`${engine} is installed (CI installs it from .ci/apt-packages.txt)`, () => {
        expect(installed, `${engine} is missing`).toBe(true);
      });
      return;
    }
    describe.skipIf(!installed)(`(${engine} ${installed ? 'present' : 'NOT INSTALLED: skipped'})`, () => body(engine));
  });
}

/**
 * How a suite's runs get their sandbox: `cold` starts one per run (the warm pool off), `warm` makes a
 * warm sandbox of exactly the run's job type ready first and requires the run to claim it (issue 10:
 * the sandbox tests hold on warm sandboxes too), `preloaded` does the same for the run's job type
 * with {@link PRELOAD} added to its `preload` (issue 18): the program's process imported those
 * modules (with their threads, sockets and files, if any) before the program arrived. `restored`
 * (gVisor, `warm_pool.restore`) is `preloaded` where the sandbox was restored from the checkpoint of
 * a template sandbox of its key rather than booted (pool/restore-images.ts).
 */
export const RUN_MODES = ['cold', 'warm', 'preloaded', 'restored'] as const;

/** Modes an engine has: `restored` (a preloaded sandbox restored from a checkpoint) is gVisor's only. */
export function modesOf(engine: (typeof REAL_ENGINES)[number]): RunMode[] {
  return RUN_MODES.filter((m) => m !== 'restored' || engine === 'gvisor');
}

/**
 * What the preloaded mode imports ahead: modules that open what an escape would want (ctypes,
 * sockets, subprocess, threads, ssl). Standard library, so every engine and machine has them.
 */
export const PRELOAD = ['ctypes', 'socket', 'subprocess', 'threading', 'ssl', 'json', 'urllib.request'];
export type RunMode = (typeof RUN_MODES)[number];

/** Config keys of a mode: no configured pools, of runs or sessions (a warm run prewarms its own job type). */
export function modeConfig(mode: RunMode): Record<string, unknown> {
  return { warm_pool: { sizes: {}, session_sizes: {}, ...(mode === 'restored' ? { restore: true } : {}) } };
}

/**
 * Runs `spec` the mode's way. Warm and preloaded: a sandbox of its job type (preloaded: with
 * {@link PRELOAD}) and its environment is made ready, and the run must be a hit. A run whose
 * requirements are not installed yet starts cold in every mode (its first run installs them).
 */
export async function runAs(mode: RunMode, rt: LocalRuntime, spec: RunSpec, options?: RunOptions): Promise<RawRun> {
  if (mode === 'cold') return rt.run(spec, options);
  if (mode === 'preloaded' || mode === 'restored') spec = { ...spec, jobType: { ...spec.jobType, preload: [...new Set([...spec.jobType.preload, ...PRELOAD])] } };
  try {
    await rt.prewarm(spec.jobType, 1, spec.requirements);
  } catch (err) {
    if (/not installed or built yet/.test(String(err))) return rt.run(spec, options);
    throw err;
  }
  const stat = () => rt.warmPoolStats().find((s) => s.job_type === spec.jobType.name);
  const before = stat()?.hits ?? 0;
  if (mode === 'restored') expect(stat()?.restored ?? 0, 'the ready sandbox was restored from a checkpoint').toBeGreaterThan(0);
  const r = await rt.run(spec, options);
  expect(stat()?.hits ?? 0, 'the run claimed a warm sandbox').toBe(before + 1);
  return r;
}

/** {@link describeEachEngine} × {@link RUN_MODES}: `body` gets the engine and the mode. */
export function describeEachEngineAndMode(title: string, body: (engine: (typeof REAL_ENGINES)[number], mode: RunMode) => void): void {
  describeEachEngine(title, (engine) => {
    describe.each(modesOf(engine))('%s', (mode) => body(engine, mode));
  });
}
