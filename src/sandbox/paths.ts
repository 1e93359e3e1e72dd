/**
 * Where the sandbox runner lives. Every runtime runs this one file (locally it is copied into each
 * engine's root; on Kubernetes it is shipped in the run's Secret), so it is named here once.
 *
 * Resolved relative to this module, not to the working directory: the build copies `runner.py` next
 * to the compiled `paths.js` (same relative layout as in `src/`), so the path holds from source and
 * from `dist/`.
 */
import { fileURLToPath } from 'node:url';

/** Absolute path of `runner.py`, beside this module. */
export const RUNNER_PATH = fileURLToPath(new URL('./runner.py', import.meta.url));

/**
 * Absolute path of `deliver.py`, beside this module: the `collector` of Kubernetes pods whose program
 * arrives by attach (it writes the program into volumes `main` mounts read-only).
 */
export const DELIVER_PATH = fileURLToPath(new URL('./deliver.py', import.meta.url));
