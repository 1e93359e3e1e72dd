/**
 * The HTTP application: middleware, one sub-app per resource, one error handler, JSON 404s.
 */
import { Hono } from 'hono';
import { AppError } from '../errors.ts';
import type { AppDeps, AppEnv } from './deps.ts';
import { errorResponse } from './errors.ts';
import { bearerAuth } from './middleware/auth.ts';
import { discardUnreadBodies, jsonBodiesOnly } from './middleware/body-rules.ts';
import { hostGuard } from './middleware/host-guard.ts';
import { httpMetrics } from './middleware/http-metrics.ts';
import { requestContext } from './middleware/request-context.ts';
import { requestTracing } from './middleware/tracing.ts';
import { sessionRoutes } from './routes/sessions.ts';
import { sessionFileRoutes } from './routes/session-files.ts';
import { dlqRoutes } from './routes/dlq.ts';
import { eventRoutes } from './routes/events.ts';
import { executeRoutes } from './routes/execute.ts';
import { executionRoutes } from './routes/executions.ts';
import { healthRoutes } from './routes/health.ts';
import { jobTypeRoutes } from './routes/job-types.ts';
import { jobRoutes } from './routes/jobs.ts';
import { metricsRoutes } from './routes/metrics.ts';
import { openapiRoutes } from './routes/openapi.ts';
import { poolRoutes } from './routes/pool.ts';
import { uiRoutes } from './routes/ui.ts';
import { deliveryRoutes } from './routes/deliveries.ts';
import { mcpRoutes } from '../mcp/server.ts';

/** Builds the app over its dependencies. */
export function createApp(deps: AppDeps): Hono<AppEnv> {
  const app = new Hono<AppEnv>();
  app.use('*', httpMetrics(deps.metrics));
  app.use('*', requestContext(deps.logger));
  app.use('*', requestTracing());
  // A body an early answer left unread is discarded after it, so the client can read that answer.
  app.use('*', discardUnreadBodies(deps.config.max_body_bytes));
  const tokens = deps.tokens;
  // Without tokens, only loopback (or listed) Host names and same-origin pages (DNS rebinding, CSRF).
  if (!tokens?.enabled) app.use('*', hostGuard(deps.config.http.allowed_hosts));
  app.use('*', jsonBodiesOnly());
  app.route('/', uiRoutes()); // before the token check: the console must load to ask for the token
  if (tokens?.enabled) {
    app.use('*', bearerAuth(tokens));
    deps.metrics.watchAuth(() => ({ fileErrors: tokens.fileErrors, failed: tokens.failed }));
  }
  // Bodies are read (and capped at max_body_bytes) by the routes that take one (bodyValidator, api/openapi.ts).
  // /openapi.json is generated from the routes declared here, read when it is first asked for.
  app.route('/', executeRoutes(deps));
  app.route('/', jobRoutes(deps));
  app.route('/', deliveryRoutes(deps));
  app.route('/', eventRoutes(deps));
  app.route('/', executionRoutes(deps));
  app.route('/', jobTypeRoutes(deps));
  app.route('/', healthRoutes(deps));
  app.route('/', dlqRoutes(deps));
  app.route('/', sessionRoutes(deps));
  app.route('/', sessionFileRoutes(deps));
  app.route('/', poolRoutes(deps));
  // The Model Context Protocol (src/mcp/server.ts): its tools call the routes above in process.
  app.route('/', mcpRoutes(deps, () => app));
  app.route('/', metricsRoutes(deps));
  app.route('/', openapiRoutes(deps, () => app));
  app.notFound((c) => errorResponse(new AppError('not_found', `no route for ${c.req.method} ${c.req.path}`), c));
  app.onError((err, c) => errorResponse(err, c));
  return app;
}
