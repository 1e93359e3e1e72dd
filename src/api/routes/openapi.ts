/** `GET /openapi.json` and `GET /docs` — filled in by the OpenAPI generator. */
import { Hono } from 'hono';
import type { AppDeps, AppEnv } from '../deps.ts';
import { buildOpenApi } from '../openapi.ts';

export function openapiRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const doc = buildOpenApi(deps.config, deps.version);
  app.get('/openapi.json', (c) => c.json(doc));
  app.get('/docs', (c) => c.html(DOCS_HTML));
  return app;
}

const DOCS_HTML = `<!doctype html><html><head><meta charset="utf-8"><title>sandpod API</title></head>
<body><h1>sandpod API</h1><p>The OpenAPI document is at <a href="/openapi.json">/openapi.json</a>.</p><div id="ops"></div>
<script>fetch('/openapi.json').then(r=>r.json()).then(d=>{const el=document.getElementById('ops');for(const [p,ops] of Object.entries(d.paths)){for(const [m,op] of Object.entries(ops)){const s=document.createElement('section');s.innerHTML='<h3><code>'+m.toUpperCase()+' '+p+'</code></h3><p>'+(op.summary||'')+'</p>';el.appendChild(s);}}});</script>
</body></html>`;
