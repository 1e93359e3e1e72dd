/**
 * Archives for the fake's `collector` exec. A run's `/output` is written to a real directory and
 * archived by the real `tar` command, as the collector does (`tar -C /output -cf - .`), so the
 * runtime parses what GNU tar really emits (entry order, `./` names, GNU long-name records, modes).
 * {@link makeTar} (tar-stream) stays for hostile archives no directory can produce: `../` or absolute
 * names, duplicates, devices.
 */
import { spawn } from 'node:child_process';
import { chmodSync, linkSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as tar from 'tar-stream';

/** One archive entry; `type` defaults to a regular file. */
export interface TarEntry {
  name: string;
  data?: Buffer | string;
  type?: 'file' | 'directory' | 'symlink' | 'link' | 'character-device' | 'block-device' | 'fifo';
  linkname?: string;
  mode?: number;
}

/** Packs entries into a tar archive (ustar, with pax/GNU headers for long names as tar-stream does). */
export async function makeTar(entries: TarEntry[]): Promise<Buffer> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  const done = new Promise<Buffer>((resolve, reject) => {
    pack.on('data', (c: unknown) => void chunks.push(c as Buffer));
    pack.on('end', () => resolve(Buffer.concat(chunks)));
    pack.on('error', reject);
  });
  for (const e of entries) {
    const type = e.type ?? 'file';
    const data = e.data === undefined ? Buffer.alloc(0) : Buffer.isBuffer(e.data) ? e.data : Buffer.from(e.data, 'utf8');
    const header = {
      name: e.name,
      type,
      mode: e.mode ?? (type === 'directory' ? 0o755 : 0o644),
      uid: 1000,
      gid: 1000,
      mtime: new Date(0),
      ...(e.linkname !== undefined ? { linkname: e.linkname } : {}),
      ...(type === 'file' ? { size: data.length } : {}),
    };
    await new Promise<void>((resolve, reject) => {
      const cb = (err?: Error | null) => (err ? reject(err) : resolve());
      // Non-file entries carry no data: tar-stream completes them by itself.
      if (type === 'file') pack.entry(header as never, data, cb);
      else pack.entry(header as never, cb);
    });
  }
  pack.finalize();
  return done;
}

/** What a runner typically leaves in /output, as `tar -C /output -cf - .` would stream it. */
export interface RunOutputs {
  stdout?: string;
  stderr?: string;
  report?: object | string;
  result?: string;
  phase?: string;
  files?: Record<string, Buffer | string>;
  extra?: TarEntry[];
}

/**
 * Writes what a runner leaves in /output into `dir` (created if needed). `extra` entries may be
 * files, directories, symlinks and hard links (names relative to `dir`, `./` allowed); anything a
 * directory cannot hold needs {@link makeTar}.
 */
export function writeOutputDir(dir: string, o: RunOutputs): void {
  mkdirSync(dir, { recursive: true });
  const put = (name: string, data: Buffer | string, mode?: number) => {
    const file = path.join(dir, name);
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, data);
    if (mode !== undefined) chmodSync(file, mode);
  };
  if (o.phase !== undefined) put('.svc_phase', o.phase);
  if (o.stdout !== undefined) put('.svc_stdout', o.stdout);
  if (o.stderr !== undefined) put('.svc_stderr', o.stderr);
  if (o.report !== undefined) put('.svc_report.json', typeof o.report === 'string' ? o.report : JSON.stringify(o.report));
  if (o.result !== undefined) put('result.json', o.result);
  for (const [name, data] of Object.entries(o.files ?? {})) put(name, data);
  for (const e of o.extra ?? []) {
    const name = e.name.replace(/^(\.\/)+/, '');
    const target = path.join(dir, name);
    if (path.relative(dir, target).startsWith('..') || path.isAbsolute(e.name)) throw new Error(`${e.name}: not inside /output; build the archive with makeTar`);
    const type = e.type ?? 'file';
    mkdirSync(path.dirname(target), { recursive: true });
    if (type === 'file') put(name, e.data ?? '', e.mode);
    else if (type === 'directory') mkdirSync(target, { recursive: true, ...(e.mode !== undefined ? { mode: e.mode } : {}) });
    else if (type === 'symlink') symlinkSync(e.linkname ?? '', target);
    else if (type === 'link') linkSync(path.join(dir, (e.linkname ?? '').replace(/^(\.\/)+/, '')), target);
    else throw new Error(`${e.name}: a ${type} cannot be made here; build the archive with makeTar`);
  }
}

/** The result of running the real `tar` with `args`: its stdout, stderr and exit code. */
export function runTar(args: readonly string[]): Promise<{ stdout: Buffer; stderr: string; exitCode: number }> {
  return new Promise((resolve, reject) => {
    const child = spawn('tar', [...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
    child.on('error', reject);
    child.on('close', (code) => resolve({ stdout: Buffer.concat(out), stderr, exitCode: code ?? 1 }));
  });
}

/** Archive of a run's /output, made by the real `tar -C DIR -cf - .` over a temporary directory. */
export async function outputTar(o: RunOutputs): Promise<Buffer> {
  const dir = mkdtempSync(path.join(tmpdir(), 'sp-output-'));
  try {
    writeOutputDir(path.join(dir, 'output'), o);
    const r = await runTar(['-C', path.join(dir, 'output'), '-cf', '-', '.']);
    if (r.exitCode !== 0) throw new Error(`tar failed (exit ${r.exitCode}): ${r.stderr}`);
    return r.stdout;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
