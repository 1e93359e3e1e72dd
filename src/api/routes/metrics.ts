/** Prometheus metrics (`GET /metrics`); gauges are refreshed on scrape. */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import type { AppDeps, AppEnv } from '../deps.ts';

const BREAKER_VALUE = { closed: 0, half_open: 1, open: 2 } as const;

/** Sub-app for `GET /metrics`. */
export function metricsRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  app.get(
    '/metrics',
    describeRoute({
      operationId: 'getMetrics',
      tags: ['operations'],
      summary: 'Prometheus metrics',
      responses: { 200: { description: 'Prometheus text exposition format', content: { 'text/plain': { schema: { type: 'string' } } } } },
    }),
    async (c) => {
      const [counts, dlq] = await Promise.all([deps.history.queueCounts().catch(() => null), deps.history.dlqStats().catch(() => null)]);
      if (dlq) deps.metrics.dlqEntries.set(dlq.total);
      deps.metrics.queueMaxSize.set(deps.config.max_queue_size);
      if (counts) {
        deps.metrics.queueDepth.set({ state: 'queued' }, counts.queued);
        deps.metrics.queueDepth.set({ state: 'running' }, counts.running);
      }
      deps.metrics.slotsBusy.set(deps.slots.busy);
      deps.metrics.breakerState.set(BREAKER_VALUE[deps.breaker.snapshot().state]);
      return c.body(await deps.metrics.registry.metrics(), 200, { 'Content-Type': deps.metrics.registry.contentType });
    },
  );
  return app;
}
