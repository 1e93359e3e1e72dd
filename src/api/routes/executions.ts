/** Execution history (SPEC §4.12): the paginated list and one record by id. */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import { AppError } from '../../errors.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { errorResponses, jsonResponse, pathParam, queryValidator } from '../openapi.ts';
import { AnyRecordSchema, ExecutionsPageSchema, exactJson } from '../responses.ts';
import { ExecutionsQuery, ViewQuery } from '../schemas.ts';

/** Sub-app for `GET /executions` and `GET /executions/{id}`. */
export function executionRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const { history } = deps;

  app.get(
    '/executions',
    describeRoute({
      operationId: 'listExecutions',
      tags: ['history'],
      summary: 'Execution history, newest first',
      responses: { 200: jsonResponse('A page of records (extended with view=full)', ExecutionsPageSchema), ...errorResponses(400) },
    }),
    queryValidator(ExecutionsQuery),
    async (c) => {
      const q = c.req.valid('query');
      return exactJson(c, await history.list({ status: q.status, jobType: q.job_type, limit: q.limit, offset: q.offset, full: q.view === 'full' }));
    },
  );

  app.get(
    '/executions/:id',
    describeRoute({
      operationId: 'getExecution',
      tags: ['history'],
      summary: 'One execution record',
      description: 'The same record as a finished job\'s result, whatever its status.',
      parameters: [pathParam('id', 'Execution id')],
      responses: { 200: jsonResponse('The record (extended with view=full)', AnyRecordSchema), ...errorResponses(400, 404) },
    }),
    queryValidator(ViewQuery),
    async (c) => {
      const { view } = c.req.valid('query');
      const row = await history.find(c.req.param('id'));
      if (!row) throw new AppError('not_found', `execution '${c.req.param('id')}' not found`);
      return exactJson(c, await history.recordOf(row, view === 'full'));
    },
  );

  return app;
}
