/**
 * Sessions (issue 19): `POST /sessions`, `GET /sessions`, `GET /sessions/{id}`, `DELETE /sessions/{id}`
 * and `POST /sessions/{id}/execute`. A cell's record is an execution record (`GET /jobs/{id}`).
 */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import * as v from 'valibot';
import { AppError } from '../../errors.ts';
import { syncView } from '../../executions/index.ts';
import type { SessionManager } from '../../sessions/manager.ts';
import { sessionView } from '../../sessions/views.ts';
import { requestMeta } from '../request-meta.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { bodyValidator, errorResponses, jsonResponse, pathParam, queryValidator } from '../openapi.ts';
import { exactJson, SyncResultSchema } from '../responses.ts';
import { requestSchemas, SessionsQuery } from '../schemas.ts';

const iso = v.nullable(v.string());
const SessionSchema = v.pipe(
  v.strictObject({
    session_id: v.string(),
    status: v.picklist(['starting', 'ready', 'busy', 'ended']),
    job_type: v.string(),
    created_at: v.string(),
    last_used_at: v.string(),
    expires_at: v.pipe(iso, v.description('When the session ends unless used (idle) or at the latest (lifetime); null once ended')),
    ended_at: iso,
    end_reason: v.pipe(v.nullable(v.picklist(['closed', 'idle', 'lifetime', 'oom', 'crashed', 'service_restart'])), v.description('Why it ended; null while live')),
    cells: v.pipe(v.number(), v.integer(), v.description('Cells run (started) so far')),
    running_cell_id: v.pipe(v.nullable(v.string()), v.description('The record of the cell running now')),
    idle_timeout: v.number(),
    max_lifetime: v.number(),
    timeout: v.number(),
    warm: v.pipe(v.boolean(), v.description('Its sandbox came ready from the runtime\'s session pool (warm_pool.session_sizes) rather than being started for it; false while it starts')),
  }),
  v.metadata({ ref: 'Session' }),
);
const SessionPageSchema = v.strictObject({ items: v.array(SessionSchema), limit: v.number(), offset: v.number(), has_more: v.boolean(), count: v.number() });
const CellResultSchema = v.pipe(
  v.object({ ...SyncResultSchema.entries, session_id: v.string(), cell: v.pipe(v.number(), v.integer(), v.description('The cell\'s number in its session (1, 2, …)')) }),
  v.metadata({ ref: 'CellResult', description: 'POST /execute\'s answer for the cell, plus its session and number; the cell\'s full record is GET /jobs/{execution_id}.' }),
);
const CellUnavailableSchema = v.pipe(
  v.strictObject({ ...CellResultSchema.entries, detail: v.string(), code: v.literal('service_unavailable'), correlation_id: v.string() }),
  v.metadata({ ref: 'CellUnavailable', description: 'A cell refused because the circuit breaker is open.' }),
);
const idParam = pathParam('id', 'Session id');

/** Sub-app for the session routes; 501 when the service has no session manager. */
export function sessionRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const schemas = requestSchemas(deps.config);
  const sessions = (): SessionManager => {
    if (!deps.sessions) throw new AppError('not_implemented', 'sessions are not available on this service');
    if (deps.isShuttingDown?.()) throw new AppError('shutting_down', 'service is shutting down; retry on another instance');
    return deps.sessions;
  };

  app.post(
    '/sessions',
    describeRoute({
      operationId: 'createSession',
      tags: ['sessions'],
      summary: 'Start a session: a persistent interpreter in a sandbox of its own',
      responses: { 201: jsonResponse('The session, ready for cells', SessionSchema), ...errorResponses(400, 413, 415, 422, 501), 503: jsonResponse('max_sessions reached, or the sandbox could not start', v.object({ detail: v.string(), code: v.string() })) },
    }),
    bodyValidator(schemas.session, deps.config.max_body_bytes, undefined, true),
    async (c) => {
      const body = (c.req.valid('json') ?? {}) as v.InferOutput<typeof schemas.session>;
      const row = await sessions().create(body, requestMeta(c));
      return exactJson(c, sessionView(row), 201);
    },
  );

  app.get(
    '/sessions',
    describeRoute({ operationId: 'listSessions', tags: ['sessions'], summary: 'Sessions, newest first', responses: { 200: jsonResponse('A page of sessions', SessionPageSchema), ...errorResponses(400, 501) } }),
    queryValidator(SessionsQuery),
    async (c) => {
      const q = c.req.valid('query');
      const { rows, hasMore } = await sessions().list({ status: q.status, limit: q.limit, offset: q.offset });
      const items = rows.map(sessionView);
      return exactJson(c, { items, limit: q.limit, offset: q.offset, has_more: hasMore, count: items.length });
    },
  );

  app.get(
    '/sessions/:id',
    describeRoute({ operationId: 'getSession', tags: ['sessions'], summary: 'One session', parameters: [idParam], responses: { 200: jsonResponse('The session', SessionSchema), ...errorResponses(404, 501) } }),
    async (c) => exactJson(c, sessionView(await sessions().get(c.req.param('id')))),
  );

  app.delete(
    '/sessions/:id',
    describeRoute({
      operationId: 'closeSession',
      tags: ['sessions'],
      summary: 'Close a session (its sandbox is destroyed; a running cell is killed)',
      parameters: [idParam],
      responses: { 200: jsonResponse('The ended session (an ended one as it was)', SessionSchema), ...errorResponses(404, 409, 501) },
    }),
    async (c) => exactJson(c, sessionView(await sessions().close(c.req.param('id')))),
  );

  app.post(
    '/sessions/:id/execute',
    describeRoute({
      operationId: 'sessionExecute',
      tags: ['sessions'],
      summary: "Run one cell in the session's interpreter",
      description: 'Variables, imports and files of earlier cells are still there. One cell at a time: 409 with running_cell_id while another runs. A cell past its timeout is interrupted (KeyboardInterrupt; the state survives, error execution_timeout).',
      parameters: [idParam],
      responses: {
        200: jsonResponse('The cell ended (successfully or not)', CellResultSchema),
        ...errorResponses(400, 404, 409, 413, 415, 501),
        503: jsonResponse('Circuit breaker open: the cell\'s answer with error type service_unavailable, as POST /execute answers', CellUnavailableSchema),
      },
    }),
    bodyValidator(schemas.cell, deps.config.max_body_bytes),
    async (c) => {
      const body = c.req.valid('json');
      const { record, cell } = await sessions().execute(c.req.param('id'), body, requestMeta(c));
      const view = { ...syncView(record), session_id: c.req.param('id'), cell };
      const error = record.error as { type?: string; message?: string } | null;
      // As POST /execute (SPEC §7.3 rule 5): with the breaker open the cell ends at once, and the HTTP status says so.
      if (error?.type === 'service_unavailable') {
        return exactJson(c, { ...view, detail: error.message ?? 'service unavailable', code: 'service_unavailable', correlation_id: c.get('correlationId') }, 503);
      }
      return exactJson(c, view);
    },
  );

  return app;
}
