/** Dead letter queue (SPEC §4.13). */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import { AppError } from '../../errors.ts';
import { noBody } from '../middleware/body-rules.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { errorResponses, jsonResponse, pathParam, queryValidator } from '../openapi.ts';
import { DlqDeletedSchema, DlqPageSchema, DlqStatsSchema, exactJson } from '../responses.ts';
import { DlqQuery } from '../schemas.ts';

/** Sub-app for `/dlq`, `/dlq/stats`, `DELETE /dlq/{id}`. */
export function dlqRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const { history } = deps;

  app.get(
    '/dlq/stats',
    describeRoute({ operationId: 'getDlqStats', tags: ['dlq'], summary: 'Dead letter queue statistics', responses: { 200: jsonResponse('Counts', DlqStatsSchema) } }),
    async (c) => c.json(await history.dlqStats()),
  );

  app.get(
    '/dlq',
    describeRoute({
      operationId: 'listDlq',
      tags: ['dlq'],
      summary: 'Dead letter queue entries, newest first',
      description: 'Runs that ended in internal_error, service_unavailable, docker_error or config_error.',
      responses: { 200: jsonResponse('A page of entries', DlqPageSchema), ...errorResponses(400) },
    }),
    queryValidator(DlqQuery),
    async (c) => {
      const q = c.req.valid('query');
      return exactJson(c, await history.dlqPage({ errorType: q.error_type, limit: q.limit, offset: q.offset }));
    },
  );

  app.delete(
    '/dlq/:id',
    describeRoute({
      operationId: 'deleteDlqEntry',
      tags: ['dlq'],
      summary: 'Remove a processed entry',
      parameters: [pathParam('id', 'Entry id', '^\\d{1,15}$')],
      responses: { 200: jsonResponse('Deleted', DlqDeletedSchema), ...errorResponses(400, 404) },
    }),
    noBody(),
    async (c) => {
      const raw = c.req.param('id');
      if (!/^\d{1,15}$/.test(raw)) throw new AppError('bad_request', `DLQ entry id must be a positive integer, got ${JSON.stringify(raw)}`);
      const id = Number(raw);
      if (!(await history.deleteDlq(id))) throw new AppError('not_found', `DLQ entry ${id} not found`);
      return c.json({ id, deleted: true as const });
    },
  );

  return app;
}
