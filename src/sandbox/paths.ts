/**
 * Where the sandbox runner lives. Every runtime runs this one file (locally it is copied into each
 * engine's root; on Kubernetes it is shipped in the run's Secret), so it is named here once.
 *
 * The runner is one Python file to the sandbox but several to us: its source is the parts under
 * `runner/` (`NN-name.py`, one concern each), joined in name order. From the source tree the joined
 * file is written once per content under the OS temp directory; `npm run build` writes it as
 * `dist/sandbox/runner.py`, next to the compiled `paths.js`, and that file wins when present. Both
 * paths are resolved relative to this module, not to the working directory.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PARTS_DIR = fileURLToPath(new URL('./runner/', import.meta.url));
const BUILT = fileURLToPath(new URL('./runner.py', import.meta.url));

/** The runner's text: the parts under `runner/` joined in name order (or the built file in `dist/`). */
export function runnerText(): string {
  if (!existsSync(PARTS_DIR)) return readFileSync(BUILT, 'utf8');
  const parts = readdirSync(PARTS_DIR).filter((f) => /^\d\d-[\w-]+\.py$/.test(f)).sort();
  if (parts.length === 0) throw new Error(`no runner parts in ${PARTS_DIR}`);
  return parts.map((f) => readFileSync(path.join(PARTS_DIR, f), 'utf8')).join('');
}

/** Writes the joined runner to `file` (the build, and images made from the source tree). */
export function writeRunner(file: string): void {
  mkdirSync(path.dirname(file), { recursive: true });
  writeFileSync(file, runnerText(), { mode: 0o644 });
}

function materialize(): string {
  if (!existsSync(PARTS_DIR)) return BUILT;
  const text = runnerText();
  const digest = createHash('sha256').update(text).digest('hex').slice(0, 16);
  const dir = path.join(tmpdir(), 'sandpod-runner');
  const file = path.join(dir, `runner-${digest}.py`);
  if (!existsSync(file)) {
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    // Written aside and renamed, so a concurrent process never reads half a runner.
    const aside = `${file}.${process.pid}.tmp`;
    writeFileSync(aside, text, { mode: 0o644 });
    renameSync(aside, file);
  }
  return file;
}

/** Absolute path of the joined `runner.py` (see above): a file every process can read and copy. */
export const RUNNER_PATH = materialize();

/**
 * Absolute path of `deliver.py`, beside this module: the `collector` of Kubernetes pods whose program
 * arrives by attach (it writes the program into volumes `main` mounts read-only).
 */
export const DELIVER_PATH = fileURLToPath(new URL('./deliver.py', import.meta.url));
