/** Dead letter queue (SPEC §4.13). */
import { Hono } from 'hono';
import * as v from 'valibot';
import { AppError } from '../../errors.ts';
import type { DlqRow } from '../../store/database.ts';
import { deleteDlq, dlqStats, listDlq } from '../../store/dlq.repository.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { intParam, query } from '../validate.ts';

const ListQuery = v.object({
  error_type: v.optional(v.pipe(v.string(), v.maxLength(64))),
  limit: intParam('limit', 1, 1000, 100),
  offset: intParam('offset', 0, Number.MAX_SAFE_INTEGER, 0),
});

export function dlqRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const db = deps.db.kysely;

  app.get('/dlq/stats', async (c) => c.json(await dlqStats(db)));

  app.get('/dlq', async (c) => {
    const q = query(c, ListQuery);
    const { rows, hasMore } = await listDlq(db, { errorType: q.error_type, limit: q.limit, offset: q.offset });
    const items = rows.map(dlqView);
    return c.json({ items, limit: q.limit, offset: q.offset, has_more: hasMore, count: items.length });
  });

  app.delete('/dlq/:id', async (c) => {
    const raw = c.req.param('id');
    if (!/^\d{1,15}$/.test(raw)) throw new AppError('bad_request', `DLQ entry id must be a positive integer, got ${JSON.stringify(raw)}`);
    const id = Number(raw);
    if (!(await deleteDlq(db, id))) throw new AppError('not_found', `DLQ entry ${id} not found`);
    return c.json({ id, deleted: true });
  });

  return app;
}

function dlqView(r: DlqRow) {
  return {
    id: Number(r.id),
    job_id: r.job_id,
    job_data: r.job_data,
    error_type: r.error_type,
    error_message: r.error_message,
    retry_count: r.retry_count,
    created_at: new Date(r.created_at).toISOString(),
    client_ip: r.client_ip,
    correlation_id: r.correlation_id,
  };
}
