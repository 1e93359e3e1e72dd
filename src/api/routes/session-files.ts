/**
 * The files API of a session (issue 19): `PUT`, `GET` (ETag, 304, `HEAD`), `DELETE`
 * `/sessions/{id}/files/{name}` and `GET /sessions/{id}/files`, on the session's `/workspace`
 * (`src/sessions/files.ts` holds the rules: plain names, no links followed, `max_artifact_bytes`).
 */
import { Hono, type Context } from 'hono';
import { describeRoute } from 'hono-openapi';
import * as v from 'valibot';
import { AppError } from '../../errors.ts';
import { checkFileName } from '../../sessions/files.ts';
import type { SessionManager } from '../../sessions/manager.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { errorResponses, jsonResponse, pathParam } from '../openapi.ts';
import { requestHeader } from '../request-header.ts';
import { readBodyBytes } from '../validate.ts';
import { contentDisposition, etagMatches } from './jobs.ts';

const FileSchema = v.strictObject({ name: v.string(), size_bytes: v.number(), modified_at: v.string() });
const FileListSchema = v.strictObject({ items: v.array(FileSchema), count: v.number() });
const WrittenSchema = v.strictObject({ name: v.string(), size_bytes: v.number(), sha256: v.string() });
const params = [pathParam('id', 'Session id'), pathParam('name', 'A plain file name in /workspace')];

/** Sub-app for a session's files. */
export function sessionFileRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const max = deps.config.max_artifact_bytes;
  const sessions = (): SessionManager => {
    if (!deps.sessions) throw new AppError('not_implemented', 'sessions are not available on this service');
    return deps.sessions;
  };

  app.get(
    '/sessions/:id/files',
    describeRoute({ operationId: 'listSessionFiles', tags: ['sessions'], summary: "The regular files at the top of the session's /workspace", parameters: [params[0]!], responses: { 200: jsonResponse('Files by name', FileListSchema), ...errorResponses(404, 409, 501, 503) } }),
    async (c) => {
      const items = await (await sessions().files(c.req.param('id'))).list();
      return c.json({ items, count: items.length });
    },
  );

  app.put(
    '/sessions/:id/files/:name',
    describeRoute({
      operationId: 'putSessionFile',
      tags: ['sessions'],
      summary: "Write a file into the session's /workspace",
      description: `The body is the file's bytes (Content-Type: application/octet-stream), at most ${max} bytes (max_artifact_bytes). Replaces a regular file of that name; a link or directory of that name is 409 (links are never followed).`,
      parameters: params,
      requestBody: { content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } },
      responses: { 201: jsonResponse('Created', WrittenSchema), 200: jsonResponse('Replaced', WrittenSchema), ...errorResponses(400, 404, 409, 413, 415, 501, 503) },
    }),
    async (c) => {
      // Read from the socket as JSON bodies are (validate.ts): an oversized file is a 413 the client
      // reads, and the connection stays usable (the unread rest is discarded by body-rules.ts).
      const data = await readBodyBytes(c, max, () => new AppError('payload_too_large', `the file is over max_artifact_bytes (${max})`));
      const name = c.req.param('name');
      checkFileName(name);
      const files = await sessions().files(c.req.param('id'));
      const w = await files.write(name, data, max);
      return c.json({ name, size_bytes: w.size, sha256: w.sha256 }, w.created ? 201 : 200);
    },
  );

  const download = async (c: Context<AppEnv>) => {
    const head = c.req.method === 'HEAD';
    const name = c.req.param('name')!;
    checkFileName(name);
    const files = await sessions().files(c.req.param('id')!);
    const f = await files.read(name, max, !head);
    const headers: Record<string, string> = { 'Content-Type': f.contentType, ETag: `"${f.sha256}"`, 'Content-Disposition': contentDisposition(name), 'Cache-Control': 'private, max-age=0, must-revalidate' };
    if (etagMatches(requestHeader(c, 'if-none-match'), f.sha256)) return c.body(null, 304, headers);
    headers['Content-Length'] = String(f.size);
    if (head) return c.body(null, 200, headers);
    return c.body(new Uint8Array(f.data ?? Buffer.alloc(0)), 200, headers);
  };
  app.on('HEAD', '/sessions/:id/files/:name', describeRoute({ operationId: 'headSessionFile', tags: ['sessions'], summary: 'A session file\'s headers only', parameters: params, responses: { 200: { description: 'Headers of the file' }, 304: { description: 'Not modified' }, 404: { description: 'No such session or file' } } }), download);
  app.get(
    '/sessions/:id/files/:name',
    describeRoute({
      operationId: 'getSessionFile',
      tags: ['sessions'],
      summary: "Read a file of the session's /workspace",
      description: 'ETag is the sha256 of the content; If-None-Match gives 304.',
      parameters: params,
      responses: { 200: { description: 'The bytes', content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } }, 304: { description: 'Not modified' }, ...errorResponses(400, 404, 409, 413, 501, 503) },
    }),
    download,
  );

  app.delete(
    '/sessions/:id/files/:name',
    describeRoute({ operationId: 'deleteSessionFile', tags: ['sessions'], summary: "Remove a file of the session's /workspace", parameters: params, responses: { 204: { description: 'Removed' }, ...errorResponses(400, 404, 409, 501, 503) } }),
    async (c) => {
      const name = c.req.param('name');
      checkFileName(name);
      await (await sessions().files(c.req.param('id'))).remove(name);
      return c.body(null, 204);
    },
  );

  return app;
}
