/**
 * Where the sandbox runner lives. Every runtime runs this one file (locally it is copied into each
 * engine's root; on Kubernetes every pod mounts it from the runner sources ConfigMap), so it is named
 * here once.
 *
 * The runner is one Python file to the sandbox but several to us: its source is the parts under
 * `runner/` (`NN-name.py`, one concern each), joined in name order (src/util/python-parts.ts);
 * `npm run build` writes `dist/sandbox/runner.py`, next to the compiled `paths.js`. Both paths are
 * resolved relative to this module, not to the working directory.
 */
import { fileURLToPath } from 'node:url';
import { materializeParts, partsText, writeParts, type PythonParts } from '../util/python-parts.ts';

export const RUNNER_PARTS: PythonParts = {
  partsDir: fileURLToPath(new URL('./runner/', import.meta.url)),
  built: fileURLToPath(new URL('./runner.py', import.meta.url)),
  name: 'runner',
};

/** The runner's text: the parts under `runner/` joined in name order (or the built file in `dist/`). */
export function runnerText(): string {
  return partsText(RUNNER_PARTS);
}

/** Writes the joined runner to `file` (the build, and images made from the source tree). */
export function writeRunner(file: string): void {
  writeParts(RUNNER_PARTS, file);
}

/** Absolute path of the joined `runner.py` (see above): a file every process can read and copy. */
export const RUNNER_PATH = materializeParts(RUNNER_PARTS);

/**
 * Absolute path of `deliver.py`, beside this module: the `collector` of Kubernetes pods whose program
 * arrives by attach (it writes the program into volumes `main` mounts read-only).
 */
export const DELIVER_PATH = fileURLToPath(new URL('./deliver.py', import.meta.url));

/**
 * Absolute path of `session-collector.py`, beside this module: the `collector` of a Kubernetes
 * session pod (it writes each cell's code and input, does the files API, hands back /output).
 */
export const SESSION_COLLECTOR_PATH = fileURLToPath(new URL('./session-collector.py', import.meta.url));
