/**
 * The generated OpenAPI document passes Redocly's recommended rules with no error, and `/docs`
 * (Swagger UI from swagger-ui-dist) works offline and behind a path prefix: every asset it references
 * is served by the service, and every reference is relative.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Hono } from 'hono';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';

let svc: TestService;
beforeAll(async () => {
  svc = await startTestService();
}, 60_000);
afterAll(async () => {
  await svc?.close();
});

const REDOCLY = path.resolve('node_modules/.bin/redocly');

describe('redocly lint (recommended rules)', () => {
  it('reports no error on /openapi.json', async () => {
    const res = await svc.get('/openapi.json');
    expect(res.status).toBe(200);
    const dir = mkdtempSync(path.join(tmpdir(), 'sandpod-openapi-'));
    try {
      const file = path.join(dir, 'openapi.json');
      writeFileSync(file, await res.text());
      // Its own empty directory: no redocly.yaml of anyone's is picked up, so the rules are `recommended`.
      const r = spawnSync(REDOCLY, ['lint', '--extends=recommended', '--format=stylish', file], {
        cwd: dir,
        encoding: 'utf8',
        timeout: 120_000,
        env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true', NO_COLOR: '1' },
      });
      const out = `${r.stdout}\n${r.stderr}`;
      expect(out).not.toMatch(/\berror\b/);
      expect(out).toContain('Your API description is valid');
      expect(r.status, out).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 130_000);
});

describe('/docs: Swagger UI, offline and relative', () => {
  /** `src` and `href` values of the page. */
  const refs = (html: string) => [...html.matchAll(/\b(?:src|href)="([^"]*)"/g)].map((m) => m[1]!);

  it('serves the page and every asset it references from the service itself', async () => {
    const res = await svc.get('/docs');
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/html');
    const html = await res.text();
    const all = refs(html);
    expect(all.length).toBeGreaterThanOrEqual(4);
    for (const ref of all) {
      expect(ref, 'relative reference').toMatch(/^\.\//);
      const asset = await svc.get(new URL(ref, 'http://x/docs').pathname);
      expect(asset.status, ref).toBe(200);
      expect((await asset.arrayBuffer()).byteLength, ref).toBeGreaterThan(0);
    }
    expect(all).toContain('./docs/swagger-ui-bundle.js');
    expect(all).toContain('./docs/swagger-ui.css');
    // Nothing is fetched from elsewhere: no absolute URL, no root-relative path.
    expect(html).not.toMatch(/(?:src|href)="(?:https?:)?\/\//);
    expect(html).not.toMatch(/(?:src|href)="\//);
    const init = await (await svc.get('/docs/init.js')).text();
    expect(init).toContain("'openapi.json'");
    expect(init).not.toMatch(/https?:|['"]\//);
    expect(init).toContain('validatorUrl: null');
    const css = await (await svc.get('/docs/swagger-ui.css')).text();
    for (const m of css.matchAll(/url\(\s*["']?([^"')]+)/g)) expect(m[1]).toMatch(/^data:/);
  });

  it('works behind a path prefix: assets and the document resolve under it', async () => {
    // A proxy that strips /sandpod before the service, as an ingress with a rewrite would.
    const proxy = new Hono();
    proxy.all('/sandpod/*', (c) => svc.app.request(c.req.path.slice('/sandpod'.length) || '/', { method: c.req.method }));
    const page = await proxy.request('/sandpod/docs');
    expect(page.status).toBe(200);
    const base = 'http://host/sandpod/docs';
    for (const ref of [...refs(await page.text()), 'openapi.json']) {
      const url = new URL(ref, base);
      expect(url.pathname.startsWith('/sandpod/'), url.pathname).toBe(true);
      expect((await proxy.request(url.pathname)).status, url.pathname).toBe(200);
    }
  });

  it('/docs/ redirects relatively to the page', async () => {
    const res = await svc.get('/docs/');
    expect(res.status).toBe(301);
    expect(new URL(res.headers.get('location')!, 'http://host/prefix/docs/').pathname).toBe('/prefix/docs');
  });

  it('unknown documentation files are 404', async () => {
    expect((await svc.get('/docs/package.json')).status).toBe(404);
    expect((await svc.get('/docs/..%2Fpackage.json')).status).toBe(404);
  });
});
