/**
 * `/ui` as HTTP: the page and its files with their content types, the Content-Security-Policy and
 * security headers, ETags, paths that are not files, the open page with authentication on, and where
 * the files come from (a prebuilt directory, else the sources bundled in memory).
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Hono } from 'hono';
import type { AppEnv } from '../../../src/api/deps.ts';
import { errorResponse } from '../../../src/api/errors.ts';
import { consoleCsp, contentTypeOf, etagMatches, loadConsoleFiles, uiRoutes } from '../../../src/api/routes/ui.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const TOKEN = 'console-test-token-0123456789';

/** The routes alone, with the app's error handler, over the files `load` gives. */
function uiApp(load: Parameters<typeof uiRoutes>[0]) {
  return new Hono<AppEnv>().route('/', uiRoutes(load)).onError((err, c) => errorResponse(err, c));
}

/** The URLs the page refers to (src= and href=), resolved against the page's address. */
function references(html: string, base: string): string[] {
  return [...html.matchAll(/\s(?:src|href)="([^"]+)"/g)].map((m) => new URL(m[1]!, base).pathname);
}

describe('/ui without authentication', () => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService();
  });
  afterAll(async () => svc?.close());

  it('serves the page with a self-only CSP whose style nonce is the one in the page, new each load', async () => {
    const res = await svc.get('/ui');
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(res.headers.get('x-frame-options')).toBe('DENY');
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    expect(res.headers.get('cache-control')).toBe('no-store');
    expect(res.headers.get('referrer-policy')).toBe('no-referrer');
    const csp = res.headers.get('content-security-policy')!;
    const html = await res.text();
    const nonce = /<meta name="csp-nonce" content="([^"]+)">/.exec(html)?.[1];
    expect(nonce).toMatch(/^[A-Za-z0-9+/]{22}==$/);
    expect(csp).toBe(consoleCsp(nonce));
    expect(csp).toContain("default-src 'none'");
    expect(csp).toContain("script-src 'self';");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toContain('unsafe-inline');
    expect(csp).not.toContain('unsafe-eval');
    // The one style attribute allowed: CodeMirror's `tab-size: 4`, by its hash.
    expect(csp).toContain("style-src-attr 'unsafe-hashes' 'sha256-qokx773Tl626SVTuhxQSccr23ixTSkbnBXWRqLjyuIg='");
    expect(html).not.toMatch(/<script(?![^>]*\ssrc=)/); // no inline script
    const again = await (await svc.get('/ui')).text();
    expect(/content="([^"]+)"/.exec(again.slice(again.indexOf('csp-nonce')))?.[1]).not.toBe(nonce);
  });

  it('serves every file the page refers to, with its content type and no external address', async () => {
    const html = await (await svc.get('/ui')).text();
    const refs = references(html, 'http://host/ui').filter((p) => p.startsWith('/ui/'));
    expect(refs.sort()).toEqual(['/ui/app.css', '/ui/app.js', '/ui/favicon.svg']);
    const types: Record<string, string> = { '/ui/app.js': 'text/javascript; charset=utf-8', '/ui/app.css': 'text/css; charset=utf-8', '/ui/favicon.svg': 'image/svg+xml' };
    for (const ref of refs) {
      const res = await svc.get(ref);
      expect(res.status, ref).toBe(200);
      expect(res.headers.get('content-type'), ref).toBe(types[ref]);
      expect(res.headers.get('content-security-policy'), ref).toBe(consoleCsp());
      const body = await res.text();
      expect(body.length, ref).toBe(Number(res.headers.get('content-length')));
      expect(body, ref).not.toMatch(/https?:\/\/(?!www\.w3\.org\/)[a-z0-9.-]+\.[a-z]{2,}\/[^\s"')]*\.(?:js|css|woff2?)\b/i); // nothing loaded from a CDN
    }
    const js = await (await svc.get('/ui/app.js')).text();
    expect(js).toContain('sandpod.token'); // the bundle is ours
    expect(js).toContain('cm-editor'); // and has CodeMirror in it
  });

  it('answers a matching If-None-Match with 304 and no body', async () => {
    const first = await svc.get('/ui/app.css');
    const etag = first.headers.get('etag')!;
    expect(etag).toMatch(/^"[0-9a-f]{64}"$/);
    expect(first.headers.get('cache-control')).toBe('no-cache');
    const again = await svc.get('/ui/app.css', { 'If-None-Match': `W/"nope", ${etag}` });
    expect(again.status).toBe(304);
    expect(await again.text()).toBe('');
    expect((await svc.get('/ui/app.css', { 'If-None-Match': '"other"' })).status).toBe(200);
  });

  it('redirects /ui/ relatively and answers 404 with the error body for what is not a console file', async () => {
    const slash = await svc.get('/ui/');
    expect(slash.status).toBe(301);
    expect(new URL(slash.headers.get('location')!, 'http://host/prefix/ui/').pathname).toBe('/prefix/ui');
    for (const p of ['/ui/nope.js', '/ui/index.html', '/ui/..%2Fpackage.json', '/ui/main.tsx', '/ui/tsconfig.json']) {
      const res = await svc.get(p);
      expect(res.status, p).toBe(404);
      expect(((await res.json()) as { code: string }).code, p).toBe('not_found');
    }
  });

  it('is not an operation of /openapi.json', async () => {
    const doc = (await (await svc.get('/openapi.json')).json()) as { paths: Record<string, unknown> };
    expect(Object.keys(doc.paths).filter((p) => p.startsWith('/ui'))).toEqual([]);
    expect(Object.keys(doc.paths)).toContain('/executions');
  });
});

describe('/ui with authentication on', () => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService({ auth: { tokens: [TOKEN] } });
  });
  afterAll(async () => svc?.close());

  it('loads the page and its files without a token, while the API still asks for one', async () => {
    const page = await svc.get('/ui');
    expect(page.status).toBe(200);
    for (const ref of references(await page.text(), 'http://host/ui').filter((p) => p.startsWith('/ui/'))) expect((await svc.get(ref)).status, ref).toBe(200);
    expect((await svc.get('/executions')).status).toBe(401);
    expect((await svc.get('/executions', { Authorization: `Bearer ${TOKEN}` })).status).toBe(200);
    expect((await svc.get('/ui/nope.js')).status).toBe(404); // open, but only for the console's files
  });
});

describe('where the files come from', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'sandpod-ui-'));
  });
  afterAll(async () => rm(dir, { recursive: true, force: true }));

  it('a prebuilt directory (npm run build) is served as it is', async () => {
    await writeFile(path.join(dir, 'index.html'), '<!doctype html><meta name="csp-nonce" content=""><p>prebuilt</p>');
    await writeFile(path.join(dir, 'app.js'), 'console.log("prebuilt")');
    const files = await loadConsoleFiles(dir);
    expect([...files.keys()].sort()).toEqual(['app.js', 'index.html']);
    const app = uiApp(() => loadConsoleFiles(dir));
    const page = await app.request('/ui');
    expect(await page.text()).toMatch(/^<!doctype html><meta name="csp-nonce" content="[^"]+"><p>prebuilt<\/p>$/);
    expect(await (await app.request('/ui/app.js')).text()).toBe('console.log("prebuilt")');
  });

  it('without one, the sources are bundled in memory', async () => {
    const files = await loadConsoleFiles(path.join(dir, 'absent'));
    expect([...files.keys()].sort()).toEqual(['app.css', 'app.js', 'favicon.svg', 'index.html']);
    expect(files.get('app.js')!.bytes.length).toBeGreaterThan(100_000); // preact + CodeMirror + the pages
  });

  it('a console that cannot be built is a 503 naming the fix, and is tried again on the next request', async () => {
    let calls = 0;
    const app = uiApp(async () => {
      calls++;
      if (calls === 1) throw new Error('esbuild is not installed');
      return loadConsoleFiles(dir);
    });
    const first = await app.request('/ui');
    expect(first.status).toBe(503);
    expect(((await first.json()) as { detail: string }).detail).toContain('npm run build');
    expect((await app.request('/ui')).status).toBe(200);
    expect(calls).toBe(2);
  });

  it('content types from mime-types, octet-stream when unknown; If-None-Match lists', () => {
    expect(contentTypeOf('app.js')).toBe('text/javascript; charset=utf-8');
    expect(contentTypeOf('app.css')).toBe('text/css; charset=utf-8');
    expect(contentTypeOf('index.html')).toBe('text/html; charset=utf-8');
    expect(contentTypeOf('x.LEGAL.txt')).toBe('text/plain; charset=utf-8');
    expect(contentTypeOf('blob.unknownext')).toBe('application/octet-stream');
    expect(etagMatches('"a", W/"b"', '"b"')).toBe(true);
    expect(etagMatches('*', '"b"')).toBe(true);
    expect(etagMatches('"a"', '"b"')).toBe(false);
    expect(etagMatches(undefined, '"b"')).toBe(false);
  });
});
