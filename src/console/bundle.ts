/**
 * Bundles the web console (`src/console/web/`) with esbuild: one `app.js` (preact, CodeMirror and our
 * code), one `app.css`, plus `index.html` and the icon copied as they are. No CDN: everything the page
 * loads comes from the service.
 *
 * Two ways in, one set of options:
 * - `npm run build` runs this file (`node --import tsx src/console/bundle.ts dist/console/public`) and
 *   the compiled service serves that directory;
 * - running from source (`make run`, the tests) has no directory to serve: the `/ui` route calls
 *   `bundleConsole()` once, on the first request, and keeps the files in memory (well under a second;
 *   nothing is written next to the sources, so nothing can go stale).
 *
 * esbuild is a development dependency: only this file imports it, and the compiled service imports
 * this file only when it has no prebuilt directory.
 */
import { readFile, mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** Where the console's sources live. */
export const WEB_DIR = fileURLToPath(new URL('./web/', import.meta.url));
/** Files copied without bundling. */
const STATIC_FILES = ['index.html', 'favicon.svg'] as const;

/** One file of the built console. */
export interface ConsoleFile {
  name: string;
  bytes: Uint8Array;
}

/** Bundles the console in memory. */
export async function bundleConsole(opts: { minify?: boolean } = {}): Promise<ConsoleFile[]> {
  const esbuild = await import('esbuild');
  const result = await esbuild.build({
    entryPoints: { app: path.join(WEB_DIR, 'main.tsx') },
    bundle: true,
    write: false,
    outdir: '/ui',
    format: 'esm',
    platform: 'browser',
    target: ['chrome109', 'firefox115', 'safari16'],
    jsx: 'automatic',
    jsxImportSource: 'preact',
    minify: opts.minify ?? true,
    sourcemap: false,
    legalComments: 'linked',
    logLevel: 'silent',
    tsconfig: path.join(WEB_DIR, 'tsconfig.json'),
  });
  const files: ConsoleFile[] = result.outputFiles.map((f) => ({ name: path.basename(f.path), bytes: f.contents }));
  for (const name of STATIC_FILES) files.push({ name, bytes: await readFile(path.join(WEB_DIR, name)) });
  return files;
}

/** Writes the bundle into `dir` (the build step). */
export async function writeConsole(dir: string): Promise<ConsoleFile[]> {
  const files = await bundleConsole();
  await mkdir(dir, { recursive: true });
  for (const f of files) await writeFile(path.join(dir, f.name), f.bytes);
  return files;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const dir = process.argv[2];
  if (!dir) {
    process.stderr.write('usage: node --import tsx src/console/bundle.ts OUTPUT_DIR\n');
    process.exit(2);
  }
  const files = await writeConsole(dir);
  process.stdout.write(`console: ${files.map((f) => `${f.name} (${f.bytes.length} B)`).join(', ')} → ${dir}\n`);
}
