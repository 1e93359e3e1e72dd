/** `POST /execute` (sync, SPEC §4.1) and `POST /execute/async` (SPEC §4.2). */
import { Hono } from 'hono';
import { AppError } from '../../errors.ts';
import { syncView } from '../../executions/views.ts';
import { clientIp } from '../client-ip.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { requestSchemas } from '../schemas.ts';
import { jsonBody } from '../validate.ts';

export function executeRoutes(deps: AppDeps) {
  const schemas = requestSchemas(deps.config);
  const app = new Hono<AppEnv>();

  app.post('/execute', async (c) => {
    refuseWhenStopping(deps);
    const body = await jsonBody(c, schemas.sync, { limit: deps.config.max_body_bytes });
    const meta = { correlationId: c.get('correlationId'), clientIp: clientIp(c) };
    const row = await deps.executions.runSync(body, meta, c.req.raw.signal);
    deps.metrics.submissions.inc({ mode: 'sync', outcome: 'created' });
    const view = syncView(row);
    const error = row.error as { type?: string; message?: string } | null;
    // SPEC §7.3 rule 5: with the breaker open the job ends at once; the HTTP status says so too.
    if (error?.type === 'service_unavailable') {
      return c.json({ ...view, detail: error.message, code: 'service_unavailable', correlation_id: c.get('correlationId') }, 503);
    }
    return c.json(view);
  });

  app.post('/execute/async', async (c) => {
    refuseWhenStopping(deps);
    const body = await jsonBody(c, schemas.async, { limit: deps.config.max_body_bytes });
    const meta = { correlationId: c.get('correlationId'), clientIp: clientIp(c) };
    const { row, created } = await deps.executions.submitAsync(body, meta);
    deps.metrics.submissions.inc({ mode: 'async', outcome: created ? 'created' : 'idempotent_replay' });
    return c.json(
      {
        job_id: row.id,
        status: queueStatus(row.status),
        job_type: row.job_type,
        created_at: new Date(row.created_at).toISOString(),
        idempotency_key: row.idempotency_key,
        created,
      },
      created ? 202 : 200,
    );
  });

  return app;
}

/** The queue's view of a record status (SPEC §3: the queue says `pending` where the record says `queued`). */
export function queueStatus(status: string): string {
  return status === 'queued' ? 'pending' : status;
}

function refuseWhenStopping(deps: AppDeps): void {
  if (deps.isShuttingDown?.()) throw new AppError('shutting_down', 'service is shutting down; retry on another instance');
}
