/** Builds tar archives for the fake's `collector` exec, hostile ones included. */
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

/** Archive of a run's /output with `./`-prefixed names, like GNU tar produces. */
export function outputTar(o: RunOutputs): Promise<Buffer> {
  const entries: TarEntry[] = [{ name: './', type: 'directory' }];
  if (o.phase !== undefined) entries.push({ name: './.svc_phase', data: o.phase });
  if (o.stdout !== undefined) entries.push({ name: './.svc_stdout', data: o.stdout });
  if (o.stderr !== undefined) entries.push({ name: './.svc_stderr', data: o.stderr });
  if (o.report !== undefined) entries.push({ name: './.svc_report.json', data: typeof o.report === 'string' ? o.report : JSON.stringify(o.report) });
  if (o.result !== undefined) entries.push({ name: './result.json', data: o.result });
  for (const [name, data] of Object.entries(o.files ?? {})) entries.push({ name: `./${name}`, data });
  entries.push(...(o.extra ?? []));
  return makeTar(entries);
}
