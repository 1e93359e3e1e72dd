/**
 * `GET /openapi.json` (generated from the routes' declarations, see `api/openapi.ts`) and `GET /docs`,
 * Swagger UI served from the `swagger-ui-dist` package: no CDN, so it works offline. Every URL the
 * page uses is relative (`./docs/…`, `openapi.json`), so it works behind a path prefix too.
 */
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';
import type { Hono } from 'hono';
import { Hono as HonoApp } from 'hono';
import { describeRoute } from 'hono-openapi';
import { AppError } from '../../errors.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { buildOpenApi } from '../openapi.ts';

const SWAGGER_DIR = path.dirname(createRequire(import.meta.url).resolve('swagger-ui-dist/package.json'));

/** Files of swagger-ui-dist the page may load, with their content types. */
const SWAGGER_FILES: Record<string, string> = {
  'swagger-ui.css': 'text/css; charset=utf-8',
  'swagger-ui.css.map': 'application/json',
  'swagger-ui-bundle.js': 'text/javascript; charset=utf-8',
  'swagger-ui-bundle.js.map': 'application/json',
  'favicon-32x32.png': 'image/png',
  'favicon-16x16.png': 'image/png',
};

/** Our initializer: loads the document relative to the page; no validator badge (it would call out). */
const INIT_JS = `window.addEventListener('load', function () {
  window.ui = SwaggerUIBundle({
    url: new URL('openapi.json', document.baseURI).href,
    dom_id: '#swagger-ui',
    deepLinking: true,
    validatorUrl: null,
  });
});
`;

/** The page at `/docs`: relative references only. */
export const DOCS_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>sandpod API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="./docs/swagger-ui.css">
<link rel="icon" type="image/png" href="./docs/favicon-32x32.png" sizes="32x32">
</head>
<body>
<div id="swagger-ui"></div>
<noscript>The API reference needs JavaScript; the machine-readable document is <a href="./openapi.json">openapi.json</a>.</noscript>
<script src="./docs/swagger-ui-bundle.js"></script>
<script src="./docs/init.js"></script>
</body>
</html>
`;

/** Routes for the document and the page; `root` is the whole app, read when the document is first asked for. */
export function openapiRoutes(deps: AppDeps, root: () => Hono<AppEnv>) {
  const app = new HonoApp<AppEnv>();
  let doc: Promise<Record<string, unknown>> | undefined;
  const cache = new Map<string, Promise<Buffer>>();

  app.get(
    '/openapi.json',
    describeRoute({
      operationId: 'getOpenApi',
      tags: ['operations'],
      summary: 'This document',
      responses: { 200: { description: 'The OpenAPI 3.1 document of this instance', content: { 'application/json': { schema: { type: 'object', description: 'An OpenAPI 3.1 document' } } } } },
    }),
    async (c) => {
    doc ??= buildOpenApi(root(), deps.version, deps.tokens?.enabled ?? false).catch((err: unknown) => {
      doc = undefined;
      throw err;
    });
    return c.json(await doc);
  });

  app.get(
    '/docs',
    describeRoute({
      operationId: 'getDocs',
      tags: ['operations'],
      summary: 'Browsable API reference (Swagger UI)',
      responses: { 200: { description: 'An HTML page; its assets are under ./docs/', content: { 'text/html': { schema: { type: 'string' } } } } },
    }),
    (c) => c.html(DOCS_HTML),
  );
  // From `/docs/` the page's `./docs/…` references would miss; send the browser one level up, relatively.
  app.get('/docs/', (c) => c.redirect('../docs', 301));

  app.get('/docs/:file', async (c) => {
    const file = c.req.param('file');
    if (file === 'init.js') return c.body(INIT_JS, 200, { 'Content-Type': 'text/javascript; charset=utf-8', 'Cache-Control': 'no-cache' });
    const type = SWAGGER_FILES[file];
    if (!type) throw new AppError('not_found', `no such documentation file '${file}'`);
    let data = cache.get(file);
    if (!data) {
      data = readFile(path.join(SWAGGER_DIR, file));
      cache.set(file, data);
      data.catch(() => cache.delete(file));
    }
    return c.body(new Uint8Array(await data), 200, { 'Content-Type': type, 'Cache-Control': 'public, max-age=86400' });
  });

  return app;
}
