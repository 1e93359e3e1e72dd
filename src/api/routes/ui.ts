/**
 * The web console at `/ui` (src/console/): the page, and its bundled files under `/ui/…`.
 *
 * Where the files come from: the compiled service (`npm run build`, `node dist/main.js`) serves
 * `dist/console/public/`, written by the build; running from source (`make run`, tests) there is no
 * such directory, and the first request bundles the sources in memory with esbuild
 * (src/console/bundle.ts). Either way the files are read once and kept in memory (about 450 KB).
 *
 * Open with authentication on: the app mounts these routes before the bearer-token check, because the
 * page must load to ask for the token. The files are the same for everyone and hold no data; every
 * API call the page makes sends the token and is checked as usual.
 *
 * Headers: a Content-Security-Policy that admits only this origin: scripts and stylesheets from
 * `/ui/…`, calls to the API, no inline script, no frames, no plugins. The one exception is
 * CodeMirror's own styling: its <style> element, admitted by a nonce made for each page load (the page
 * reads it from `<meta name="csp-nonce">` and hands it to the editor), and the one style attribute it
 * writes, admitted by its hash. Files carry an ETag (their SHA-256) and
 * `Cache-Control: no-cache`, so a browser revalidates them and gets a 304 while they are unchanged; the
 * page itself is `no-store` (its nonce is new each time). X-Frame-Options and nosniff come from the
 * request-context middleware, as on every answer.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Hono } from 'hono';
import mime from 'mime-types';
import { AppError } from '../../errors.ts';
import type { AppEnv } from '../deps.ts';

/** Where `npm run build` puts the bundle, next to the compiled service. */
export const PREBUILT_DIR = fileURLToPath(new URL('../../console/public/', import.meta.url));

/** One file the console serves. */
export interface UiFile {
  bytes: Uint8Array;
  type: string;
  etag: string;
}

/** The console's files by name. */
export type UiFiles = ReadonlyMap<string, UiFile>;

/** Reads the prebuilt directory when there is one, else bundles the sources in memory. */
export async function loadConsoleFiles(dir = PREBUILT_DIR): Promise<UiFiles> {
  let files: { name: string; bytes: Uint8Array }[];
  if (existsSync(path.join(dir, 'index.html'))) {
    const names = (await readdir(dir, { withFileTypes: true })).filter((d) => d.isFile()).map((d) => d.name);
    files = await Promise.all(names.map(async (name) => ({ name, bytes: await readFile(path.join(dir, name)) })));
  } else {
    const { bundleConsole } = await import('../../console/bundle.ts');
    files = await bundleConsole();
  }
  return new Map(files.map((f) => [f.name, { bytes: f.bytes, type: contentTypeOf(f.name), etag: `"${createHash('sha256').update(f.bytes).digest('hex')}"` }]));
}

/** The Content-Type for a file name (mime-types; charset for text), octet-stream when unknown. */
export function contentTypeOf(name: string): string {
  return mime.contentType(path.extname(name)) || 'application/octet-stream';
}

/**
 * The only style attributes the page may carry, by hash: CodeMirror writes its editor's tab width as
 * `style="tab-size: 4"` (an attribute, not the CSSOM, so a CSP without this would block it).
 */
const STYLE_ATTRIBUTE_HASHES = ['tab-size: 4'].map((v) => `'sha256-${createHash('sha256').update(v).digest('base64')}'`);

/** The console's Content-Security-Policy; `nonce` admits CodeMirror's <style> element on the page. */
export function consoleCsp(nonce?: string): string {
  return [
    "default-src 'none'",
    "script-src 'self'",
    `style-src 'self'${nonce ? ` 'nonce-${nonce}'` : ''}`,
    `style-src-attr 'unsafe-hashes' ${STYLE_ATTRIBUTE_HASHES.join(' ')}`,
    "img-src 'self'",
    "font-src 'self'",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "object-src 'none'",
  ].join('; ');
}

/** Whether an If-None-Match header (a list, weak tags, `*`) matches `etag`. */
export function etagMatches(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  return header.split(',').some((t) => {
    const tag = t.trim().replace(/^W\//, '');
    return tag === '*' || tag === etag;
  });
}

const NONCE_META = '<meta name="csp-nonce" content="">';

/** Routes for `/ui`; `load` is called once, on the first request (again after a failure). */
export function uiRoutes(load: () => Promise<UiFiles> = loadConsoleFiles) {
  const app = new Hono<AppEnv>();
  let files: Promise<UiFiles> | undefined;
  const get = (): Promise<UiFiles> => {
    files ??= load().catch((err: unknown) => {
      files = undefined;
      throw new AppError('service_unavailable', `the web console is not built (${(err as Error).message}); run npm run build, or run the service from source`);
    });
    return files;
  };
  const security = { 'Referrer-Policy': 'no-referrer', 'Cross-Origin-Opener-Policy': 'same-origin', 'Cross-Origin-Resource-Policy': 'same-origin' };

  // Not an API operation, so not in /openapi.json (routes without describeRoute are left out).
  app.get('/ui', async (c) => {
    const page = (await get()).get('index.html');
    if (!page) throw new AppError('service_unavailable', 'the web console has no index.html');
    const nonce = randomBytes(16).toString('base64');
    const html = Buffer.from(page.bytes).toString('utf8').replace(NONCE_META, `<meta name="csp-nonce" content="${nonce}">`);
    return c.body(html, 200, { ...security, 'Content-Type': page.type, 'Cache-Control': 'no-store', 'Content-Security-Policy': consoleCsp(nonce) });
  });
  // From `/ui/` the page's `ui/…` references would miss; send the browser one level up, relatively.
  app.get('/ui/', (c) => c.redirect('../ui', 301));
  app.get('/ui/:file', async (c) => {
    const name = c.req.param('file');
    const file = name === 'index.html' ? undefined : (await get()).get(name);
    if (!file) throw new AppError('not_found', `no such console file '${name}'`);
    const headers = { ...security, ETag: file.etag, 'Cache-Control': 'no-cache', 'Content-Security-Policy': consoleCsp() };
    if (etagMatches(c.req.header('if-none-match'), file.etag)) return c.body(null, 304, headers);
    return c.body(new Uint8Array(file.bytes), 200, { ...headers, 'Content-Type': file.type, 'Content-Length': String(file.bytes.length) });
  });
  return app;
}
