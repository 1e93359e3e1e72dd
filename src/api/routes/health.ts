/**
 * Health (SPEC §2.10, §4.10) plus two cheap probes for orchestrators:
 * `/livez` (the process answers; never depends on the engine or breaker) and `/readyz` (the database
 * answers and the service is not shutting down).
 * `/health` answers 200 when healthy and 503 when degraded (engine unavailable, a problem the runtime
 * reports such as a failed preflight, breaker open, database down) or draining (SIGTERM received).
 * Its details (`reasons`, engine, database, queue, version…) go only to a trusted caller (issue 22): with authentication on, one with
 * a valid token; with it off, one whose Host is allowed (api/middleware/host-guard.ts). Anyone else —
 * a kubelet probe, a scanner, a rebound browser page — gets only `{status}`, with the same status code.
 */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import type { AppDeps, AppEnv } from '../deps.ts';
import { jsonResponse } from '../openapi.ts';
import * as v from 'valibot';
import { HealthSchema, LiveSchema, ReadySchema } from '../responses.ts';

/** `/health` to an untrusted caller: the status alone. */
export const HealthStatusSchema = v.pipe(
  v.strictObject({ status: v.picklist(['healthy', 'degraded', 'draining']) }),
  v.metadata({ ref: 'HealthStatus', description: 'GET /health without a valid token (authentication on) or from a Host that is not allowed (authentication off): the status alone.' }),
);
const HealthAnswer = v.union([HealthSchema, HealthStatusSchema]);

/** Sub-app for `/health`, `/livez`, `/readyz`. */
export function healthRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();

  app.get(
    '/health',
    describeRoute({
      operationId: 'getHealth',
      tags: ['operations'],
      summary: 'Health',
      description:
        'Degraded (with `reasons`) when the sandbox engine is unavailable or reports a problem (a failed preflight of run pods), the circuit breaker is open or the database does not answer. ' +
        'The details need a valid token when authentication is on (an allowed Host when it is off); without, the body is only `{status}` (HealthStatus).',
      responses: { 200: jsonResponse('Healthy', HealthAnswer), 503: jsonResponse('Degraded, or draining (shutting down)', HealthAnswer) },
    }),
    async (c) => {
      const [rt, counts] = await Promise.all([deps.runtime.health().catch(() => null), deps.history.queueCounts().catch(() => null)]);
      const breaker = deps.breaker.snapshot();
      const reasons = [
        ...(!rt ? ['the runtime did not answer'] : !rt.available ? [`the sandbox engine is unavailable${rt.detail?.error ? `: ${String(rt.detail.error)}` : ''}`] : []),
        ...(rt?.problems ?? []),
        ...(breaker.state === 'open' ? ['the circuit breaker is open'] : []),
        ...(counts === null ? ['the database does not answer'] : []),
      ];
      const draining = deps.isShuttingDown?.() ?? false;
      if (draining) reasons.unshift('the service is draining: it is shutting down and takes no new work');
      const degraded = reasons.length > 0;
      const status = draining ? 'draining' : degraded ? 'degraded' : 'healthy';
      if (c.get('principal') === undefined) return c.json({ status }, degraded ? 503 : 200);
      const body = {
        status,
        reasons,
        docker_available: rt?.available ?? false,
        gvisor_available: rt?.gvisorAvailable ?? false,
        circuit_breaker: breaker,
        version: deps.version,
        production_mode: deps.config.production_mode,
        queue_stats: {
          pending: counts?.queued ?? 0,
          running: counts?.running ?? 0,
          max_workers: deps.config.max_workers,
          max_queue_size: deps.config.max_queue_size,
        },
        runtime: deps.config.runtime,
        sandbox: {
          engine: rt?.engine ?? 'unknown',
          isolated: rt?.isolated ?? false,
          limits: rt?.limits ?? 'unknown',
          security_mode: deps.config.security_mode,
          ...(rt && !rt.isolated ? { warning: 'UNSAFE: the process engine runs code without any isolation; use it only for development' } : {}),
          ...(rt?.detail ? { detail: rt.detail } : {}),
        },
        database: { kind: deps.history.kind, available: counts !== null },
      };
      return c.json(body, degraded ? 503 : 200);
    },
  );

  app.get(
    '/livez',
    describeRoute({ operationId: 'getLiveness', tags: ['operations'], summary: 'Liveness probe', responses: { 200: jsonResponse('The process answers', LiveSchema) } }),
    (c) => c.json({ status: 'ok' as const }),
  );

  app.get(
    '/readyz',
    describeRoute({
      operationId: 'getReadiness',
      tags: ['operations'],
      summary: 'Readiness probe',
      responses: { 200: jsonResponse('Ready: the database answers', ReadySchema), 503: jsonResponse('Shutting down, or the database does not answer', ReadySchema) },
    }),
    async (c) => {
      if (deps.isShuttingDown?.()) return c.json({ status: 'shutting_down' }, 503);
      try {
        await deps.history.ping();
        return c.json({ status: 'ready' });
      } catch {
        return c.json({ status: 'database_unavailable' }, 503);
      }
    },
  );

  return app;
}
