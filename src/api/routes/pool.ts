/**
 * `GET /pool/stats` (SPEC §4.11, shape ours): this process's worker slots, the shared queue's depth
 * and age, per-job-type counts, the runtime's warm sandboxes per job type (issue 10) and its ready session sandboxes (issue 19).
 */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import type { AppDeps, AppEnv } from '../deps.ts';
import { jsonResponse } from '../openapi.ts';
import { PoolStatsSchema } from '../responses.ts';

/** Sub-app for `GET /pool/stats`. */
export function poolRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  app.get(
    '/pool/stats',
    describeRoute({ operationId: 'getPoolStats', tags: ['operations'], summary: 'Worker pool statistics', responses: { 200: jsonResponse('Slots and queue', PoolStatsSchema) } }),
    async (c) => {
      const q = await deps.history.queueStats();
      return c.json({
        worker_id: deps.executions.workerId,
        slots: { size: deps.slots.size, busy: deps.slots.busy, free: deps.slots.free, waiting_sync: deps.slots.waiting },
        queue: { queued: q.queued, running: q.running, max_queue_size: deps.config.max_queue_size, oldest_queued_age_ms: q.oldest_queued_age_ms },
        by_job_type: q.by_job_type,
        breaker: deps.breaker.snapshot().state,
        warm: (deps.runtime.warmPoolStats?.() ?? []).map(({ handover_retries: _retries, ...s }) => s),
        sessions: deps.runtime.sessionPoolStats?.() ?? [],
      });
    },
  );
  return app;
}
