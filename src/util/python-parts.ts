/**
 * A Python program kept as parts (`NN-name.py`, one concern each, joined in name order) but run as one
 * file: the sandbox runner (copied whole into every sandbox) and the local spawner (run with
 * `python3 -I -S`, which imports nothing from beside it). From the source tree the joined file is
 * written once per content under the OS temp directory; the build writes it beside the compiled
 * module (`npm run build`, src/util/write-python.ts), and that file wins when present.
 */
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

/** A joined program: its parts directory and the built file that stands for it in `dist/`. */
export interface PythonParts {
  partsDir: string;
  built: string;
  /** Name of the materialized file (e.g. `runner`). */
  name: string;
}

/** The program's text: the parts joined in name order (or the built file in `dist/`). */
export function partsText(p: PythonParts): string {
  if (!existsSync(p.partsDir)) return readFileSync(p.built, 'utf8');
  const parts = readdirSync(p.partsDir).filter((f) => /^\d\d-[\w-]+\.py$/.test(f)).sort();
  if (parts.length === 0) throw new Error(`no ${p.name} parts in ${p.partsDir}`);
  return parts.map((f) => readFileSync(path.join(p.partsDir, f), 'utf8')).join('');
}

/** Writes the joined program to `file`. */
export function writeParts(p: PythonParts, file: string): void {
  mkdirSync(path.dirname(file), { recursive: true });
  writeFileSync(file, partsText(p), { mode: 0o644 });
}

/**
 * Whether `dir` is ours alone to write: a real directory owned by this process's user and writable by
 * nobody else. The temp directory is shared, and the spawner runs as root: a directory someone else
 * made first (or a link) must not decide what we run.
 */
function ours(dir: string): boolean {
  try {
    const st = lstatSync(dir);
    return st.isDirectory() && st.uid === process.getuid?.() && (st.mode & 0o022) === 0;
  } catch {
    return false;
  }
}

/** A path to the joined program that every process can read: the built file, or one made from the parts. */
export function materializeParts(p: PythonParts): string {
  if (!existsSync(p.partsDir)) return p.built;
  const text = partsText(p);
  const digest = createHash('sha256').update(text).digest('hex').slice(0, 16);
  let dir = path.join(tmpdir(), `sandpod-${p.name}-${process.getuid?.() ?? 'u'}`);
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  if (!ours(dir)) {
    dir = mkdtempSync(path.join(tmpdir(), `sandpod-${p.name}-`));
    chmodSync(dir, 0o755);
  }
  const file = path.join(dir, `${p.name}-${digest}.py`);
  // Only a file with exactly this text is used; anything else there is replaced. Written aside and
  // renamed, so a concurrent process never reads half a program.
  const current = existsSync(file) ? readFileSync(file, 'utf8') : null;
  if (current !== text) {
    const aside = `${file}.${process.pid}.tmp`;
    writeFileSync(aside, text, { mode: 0o644 });
    renameSync(aside, file);
  }
  return file;
}
