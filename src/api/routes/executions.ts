/** Execution history (SPEC §4.12): the paginated list and one record by id. */
import { Hono } from 'hono';
import * as v from 'valibot';
import { AppError } from '../../errors.ts';
import { recordView } from '../../executions/views.ts';
import { listArtifacts, listArtifactsFor } from '../../store/artifacts.repository.ts';
import { getExecution, listExecutions } from '../../store/executions.repository.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { RECORD_STATUSES } from '../schemas.ts';
import { intParam, query, viewParam } from '../validate.ts';

const ListQuery = v.object({
  status: v.optional(v.picklist(RECORD_STATUSES, `status must be one of ${RECORD_STATUSES.join(', ')}`)),
  job_type: v.optional(v.pipe(v.string(), v.maxLength(63))),
  limit: intParam('limit', 1, 1000, 100),
  offset: intParam('offset', 0, Number.MAX_SAFE_INTEGER, 0),
  view: viewParam,
});

export function executionRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const db = deps.db.kysely;

  app.get('/executions', async (c) => {
    const q = query(c, ListQuery);
    const status = q.status === 'pending' ? 'queued' : q.status;
    const { rows, hasMore } = await listExecutions(db, { status, jobType: q.job_type, limit: q.limit, offset: q.offset });
    const full = q.view === 'full';
    const arts = full ? await listArtifactsFor(db, rows.map((r) => r.id)) : [];
    const items = rows.map((r) => recordView(r, full, arts.filter((a) => a.execution_id === r.id)));
    return c.json({ items, limit: q.limit, offset: q.offset, has_more: hasMore, count: items.length });
  });

  app.get('/executions/:id', async (c) => {
    const { view } = query(c, v.object({ view: viewParam }));
    const row = await getExecution(db, c.req.param('id'));
    if (!row) throw new AppError('not_found', `execution '${c.req.param('id')}' not found`);
    const full = view === 'full';
    return c.json(recordView(row, full, full ? await listArtifacts(db, row.id) : []));
  });

  return app;
}
