/**
 * `GET /pool/stats` (SPEC §4.11, shape ours): this process's worker slots, the shared queue's depth
 * and age, and per-job-type counts.
 */
import { Hono } from 'hono';
import { sql } from 'kysely';
import type { AppDeps, AppEnv } from '../deps.ts';

export function poolRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  app.get('/pool/stats', async (c) => {
    const r = await sql<{ job_type: string; status: string; n: number; oldest: Date | null }>`
      SELECT job_type, status, count(*)::int AS n, min(created_at) AS oldest
      FROM executions WHERE status IN ('queued', 'running') GROUP BY job_type, status`.execute(deps.db.kysely);
    const byType: Record<string, { queued: number; running: number }> = {};
    let queued = 0;
    let running = 0;
    let oldest: number | null = null;
    for (const row of r.rows) {
      const t = (byType[row.job_type] ??= { queued: 0, running: 0 });
      if (row.status === 'queued') {
        t.queued += row.n;
        queued += row.n;
        if (row.oldest) oldest = Math.min(oldest ?? Infinity, new Date(row.oldest).getTime());
      } else {
        t.running += row.n;
        running += row.n;
      }
    }
    return c.json({
      worker_id: deps.executions.workerId,
      slots: { size: deps.slots.size, busy: deps.slots.busy, free: deps.slots.free, waiting_sync: deps.slots.waiting },
      queue: {
        queued,
        running,
        max_queue_size: deps.config.max_queue_size,
        oldest_queued_age_ms: oldest === null ? null : Math.max(0, Date.now() - oldest),
      },
      by_job_type: byType,
      breaker: deps.breaker.snapshot().state,
    });
  });
  return app;
}
