/** `GET /jobs/{id}/deliveries` (issue 21): a job's completion webhooks, attempt by attempt. */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import * as v from 'valibot';
import { AppError } from '../../errors.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { errorResponses, jsonResponse, pathParam } from '../openapi.ts';

const iso = v.pipe(v.string(), v.isoTimestamp());
const nonNegInt = v.pipe(v.number(), v.integer(), v.minValue(0));

const AttemptSchema = v.strictObject({
  attempt: v.pipe(nonNegInt, v.description('1 for the first attempt')),
  started_at: iso,
  duration_ms: nonNegInt,
  status_code: v.pipe(v.nullable(nonNegInt), v.description('The receiver\'s HTTP status; null when none came (refused, unreachable, timed out)')),
  error: v.pipe(v.nullable(v.string()), v.description('Why the attempt did not deliver; the answer\'s body is never stored')),
  outcome: v.pipe(v.picklist(['delivered', 'retried', 'failed']), v.description('retried: another attempt follows; failed: the last one')),
});

const DeliverySchema = v.strictObject({
  webhook_id: v.pipe(v.string(), v.description('The webhook-id header of every attempt (the same on retries)')),
  url: v.string(),
  status: v.picklist(['pending', 'delivered', 'failed']),
  attempt_count: nonNegInt,
  created_at: iso,
  next_attempt_at: v.pipe(v.nullable(iso), v.description('When the next attempt is due (pending only)')),
  ended_at: v.nullable(iso),
  last_status_code: v.nullable(nonNegInt),
  last_error: v.nullable(v.string()),
  attempts: v.array(AttemptSchema),
});

/** The response of `GET /jobs/{id}/deliveries`. */
export const DeliveriesSchema = v.pipe(
  v.strictObject({ job_id: v.string(), callback_url: v.nullable(v.string()), deliveries: v.array(DeliverySchema) }),
  v.metadata({ ref: 'WebhookDeliveries', description: 'A job\'s completion webhooks; empty until the job ends (or when it has no callback_url).' }),
);

/** Sub-app for `GET /jobs/{id}/deliveries`. */
export function deliveryRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  app.get(
    '/jobs/:id/deliveries',
    describeRoute({
      operationId: 'listJobDeliveries',
      tags: ['jobs'],
      summary: 'Webhook deliveries of a job',
      description: 'Each delivery of the job\'s callback_url with every attempt: when, how long, the status code or the error, and what followed.',
      parameters: [pathParam('id', 'Job id (the execution_id)')],
      responses: { 200: jsonResponse('The deliveries', DeliveriesSchema), ...errorResponses(404) },
    }),
    async (c) => {
      const id = c.req.param('id');
      const row = await deps.history.find(id);
      if (!row) throw new AppError('not_found', `job '${id}' not found`);
      return c.json({ job_id: id, callback_url: row.callback_url ?? null, deliveries: await deps.history.deliveries(id) });
    },
  );
  return app;
}
