/**
 * The installed directory of a job-type build as ONE reproducible OCI layer.
 *
 * {@link collectTree} reads the tar stream the service pulls out of the build pod (`tar -C /build
 * -cf - .`, the same exec technique as a run's `/output`) without ever writing under a name from the
 * archive: every regular file goes to `<dir>/<n>`, names are checked like output entries
 * (`../`, absolute names, control characters are refused), devices and fifos are refused, symlinks
 * are kept as metadata only and hard links become copies of their target.
 *
 * {@link writeLayer} writes the tree under a prefix as a gzip'd tar whose bytes depend only on the
 * tree's names, contents and executable bits: entries sorted by name, every parent directory
 * present, mtime 0, uid/gid 0 without user names, modes 0755 (directories, executables) or 0644,
 * gzip with a fixed level and no timestamp. It returns the blob digest (compressed) and the diff id
 * (uncompressed) an image config and manifest need.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { PassThrough, Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGzip } from 'node:zlib';
import * as tar from 'tar-stream';
import { normalizeEntryName } from '../runs/output-tar.ts';

/** One entry of a collected tree. */
export type TreeEntry =
  | { type: 'directory'; name: string }
  | { type: 'file'; name: string; size: number; executable: boolean; /** where the bytes are */ source: { file: string } | { data: Buffer } }
  | { type: 'symlink'; name: string; target: string };

/** Caps of one collection. */
export interface TreeLimits {
  maxTotalBytes: number;
  maxEntries: number;
}

export const DEFAULT_TREE_LIMITS: TreeLimits = { maxTotalBytes: 8 * 1024 ** 3, maxEntries: 500_000 };

/** The archive could not be taken as a build tree. */
export class TreeError extends Error {
  override readonly name = 'TreeError';
}

/**
 * Reads a tar stream into `dir` (see the module comment). Resolves with the entries by name
 * (without the archive's `./` root); rejects on a refused entry, a cap, or a broken stream.
 */
export function collectTree(source: Readable, dir: string, limits: TreeLimits = DEFAULT_TREE_LIMITS): Promise<Map<string, TreeEntry>> {
  mkdirSync(dir, { recursive: true });
  const entries = new Map<string, TreeEntry>();
  let total = 0;
  let n = 0;
  return new Promise((resolve, reject) => {
    const extract = tar.extract();
    let settled = false;
    const finish = (err?: Error) => {
      if (settled) return;
      settled = true;
      if (typeof source.unpipe === 'function') source.unpipe(extract);
      if (err) {
        extract.destroy();
        reject(err);
      } else resolve(entries);
    };
    extract.on('entry', (header, stream, next) => {
      const fail = (msg: string) => {
        stream.resume();
        finish(new TreeError(msg));
      };
      if (++n > limits.maxEntries) return fail(`the build left more than ${limits.maxEntries} files`);
      const name = normalizeEntryName(header.name);
      if (typeof name !== 'string') return fail(`the build left an entry with an unsafe name: ${JSON.stringify(name.name)}`);
      const type = header.type ?? 'file';
      if (name === '' || type === 'directory') {
        if (name !== '') entries.set(name, { type: 'directory', name });
        stream.on('end', () => next());
        stream.resume();
        return;
      }
      if (type === 'symlink') {
        entries.set(name, { type: 'symlink', name, target: header.linkname ?? '' });
        stream.on('end', () => next());
        stream.resume();
        return;
      }
      if (type === 'link') {
        const target = normalizeEntryName(header.linkname ?? '');
        const of = typeof target === 'string' ? entries.get(target) : undefined;
        if (!of || of.type !== 'file') return fail(`the build left a hard link to something that is not a file: ${name}`);
        entries.set(name, { ...of, name });
        stream.on('end', () => next());
        stream.resume();
        return;
      }
      if (type !== 'file' && type !== 'contiguous-file') return fail(`the build left a ${type} (${name}); only files, directories and symlinks can be published`);
      const file = path.join(dir, String(n));
      let size = 0;
      const count = new Transform({
        transform(chunk: Buffer, _enc, cb) {
          size += chunk.length;
          total += chunk.length;
          if (total > limits.maxTotalBytes) cb(new TreeError(`the build left more than ${limits.maxTotalBytes} bytes`));
          else cb(null, chunk);
        },
      });
      pipeline(stream, count, createWriteStream(file, { mode: 0o600 })).then(
        () => {
          entries.set(name, { type: 'file', name, size, executable: ((header.mode ?? 0o644) & 0o111) !== 0, source: { file } });
          next();
        },
        (err: Error) => finish(err instanceof TreeError ? err : new TreeError(`reading the build's files failed: ${err.message}`)),
      );
    });
    extract.on('finish', () => finish());
    extract.on('error', (err: Error) => finish(new TreeError(`the build's archive is broken: ${err.message}`)));
    source.on('error', (err: Error) => finish(err));
    source.pipe(extract);
  });
}

/** Bytes of a tree file. */
export function readTreeFile(e: Extract<TreeEntry, { type: 'file' }>): Buffer {
  return 'data' in e.source ? e.source.data : readFileSync(e.source.file);
}

/** Byte-wise order of names (what `--sort=name` gives), the same on every machine. */
function byName(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/** What {@link writeLayer} wrote. */
export interface LayerBlob {
  /** sha256 of the gzip'd bytes: the blob digest. */
  digest: string;
  /** sha256 of the tar: the config's `rootfs.diff_ids` entry. */
  diffId: string;
  size: number;
  file: string;
}

/**
 * Writes `entries` under `prefix` (e.g. `sandpod-env`) as a reproducible gzip'd tar in `file` (see
 * the module comment). `prefix`'s own directories are entries too.
 */
export async function writeLayer(entries: Iterable<TreeEntry>, prefix: string, file: string): Promise<LayerBlob> {
  const all = new Map<string, TreeEntry>();
  const addDir = (name: string) => {
    if (!all.has(name)) all.set(name, { type: 'directory', name });
  };
  const parts = prefix.split('/').filter(Boolean);
  for (let i = 1; i <= parts.length; i++) addDir(parts.slice(0, i).join('/'));
  for (const e of entries) {
    const full = `${parts.join('/')}/${e.name}`;
    const segs = full.split('/');
    for (let i = 1; i < segs.length; i++) addDir(segs.slice(0, i).join('/'));
    all.set(full, { ...e, name: full } as TreeEntry);
  }
  const names = [...all.keys()].sort(byName);

  const pack = tar.pack();
  const tarHash = createHash('sha256');
  const gzHash = createHash('sha256');
  let size = 0;
  const tap = new PassThrough();
  tap.on('data', (c: Buffer) => tarHash.update(c));
  const count = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      gzHash.update(chunk);
      size += chunk.length;
      cb(null, chunk);
    },
  });
  const writing = pipeline(pack, tap, createGzip({ level: 6 }), count, createWriteStream(file, { mode: 0o600 }));
  const common = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' };
  for (const name of names) {
    const e = all.get(name)!;
    if (e.type === 'directory') {
      await entry(pack, { ...common, name: `${name}/`, type: 'directory', mode: 0o755 });
    } else if (e.type === 'symlink') {
      await entry(pack, { ...common, name, type: 'symlink', linkname: e.target, mode: 0o777 });
    } else {
      const header = { ...common, name, type: 'file' as const, mode: e.executable ? 0o755 : 0o644, size: e.size };
      if ('data' in e.source) await entry(pack, header, e.source.data);
      else await entryFromFile(pack, header, e.source.file);
    }
  }
  pack.finalize();
  await writing;
  return { digest: `sha256:${gzHash.digest('hex')}`, diffId: `sha256:${tarHash.digest('hex')}`, size, file };
}

function entry(pack: tar.Pack, header: Parameters<tar.Pack["entry"]>[0], data?: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    pack.entry(header, data ?? Buffer.alloc(0), (err) => (err ? reject(err) : resolve()));
  });
}

function entryFromFile(pack: tar.Pack, header: Parameters<tar.Pack["entry"]>[0], file: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const sink = pack.entry(header, (err) => (err ? reject(err) : resolve()));
    const src = createReadStream(file);
    src.on('error', reject);
    src.pipe(sink);
  });
}
