/** `POST /execute` (sync, SPEC §4.1) and `POST /execute/async` (SPEC §4.2). */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import { AppError } from '../../errors.ts';
import { isTerminal, queueStatus, syncView, TakenOverError } from '../../executions/index.ts';
import { requestMeta } from '../request-meta.ts';
import { clientGoneSignal } from '../request-header.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { bodyValidator, errorResponses, jsonResponse } from '../openapi.ts';
import * as v from 'valibot';
import { ErrorSchema, exactJson, IdempotencyConflictSchema, SubmissionSchema, SyncResultSchema, SyncUnavailableSchema } from '../responses.ts';
import { requestSchemas } from '../schemas.ts';

/** Sub-app for `POST /execute` and `POST /execute/async`. */
export function executeRoutes(deps: AppDeps) {
  const schemas = requestSchemas(deps.config);
  const app = new Hono<AppEnv>();
  const limit = deps.config.max_body_bytes;
  const refuseWhenStopping = () => {
    if (deps.isShuttingDown?.()) throw new AppError('shutting_down', 'service is shutting down; retry on another instance');
  };

  app.post(
    '/execute',
    describeRoute({
      operationId: 'execute',
      tags: ['execute'],
      summary: 'Run code and wait for the result',
      description: 'Blocks until the run ends. A failure of the code is 200 with success=false; the error object says why.',
      responses: {
        200: jsonResponse('The run ended (successfully or not)', SyncResultSchema),
        ...errorResponses(400, 413, 415),
        503: jsonResponse('Circuit breaker open (the SPEC §2.2 body with error type service_unavailable), or shutting down, or the run was taken over by another replica and did not end in time, or its verdict could not be recorded (the error body)', v.union([SyncUnavailableSchema, ErrorSchema])),
      },
    }),
    bodyValidator(schemas.sync, limit, refuseWhenStopping),
    async (c) => {
      const body = c.req.valid('json');
      const meta = requestMeta(c);
      const gone = clientGoneSignal(c);
      const row = await deps.executions.runSync(body, meta, gone).catch(async (err: unknown) => {
        if (!(err instanceof TakenOverError)) throw err;
        // Another replica took the run over (this one was presumed dead) and settles it: its verdict is the answer.
        const settled = await deps.waiter.wait(err.executionId, err.waitMs, gone);
        if (settled && isTerminal(settled.status)) return settled;
        throw new AppError('service_unavailable', `execution ${err.executionId} was taken over by another replica and has not ended yet; its result will be at GET /jobs/${err.executionId}/result`, { execution_id: err.executionId });
      });
      deps.metrics.submissions.inc({ mode: 'sync', outcome: 'created' });
      const view = syncView(row);
      const error = row.error as { type?: string; message?: string } | null;
      // SPEC §7.3 rule 5: with the breaker open the job ends at once; the HTTP status says so too.
      if (error?.type === 'service_unavailable') {
        return exactJson(c, { ...view, detail: error.message, code: 'service_unavailable', correlation_id: c.get('correlationId') }, 503);
      }
      return exactJson(c, view);
    },
  );

  app.post(
    '/execute/async',
    describeRoute({
      operationId: 'executeAsync',
      tags: ['execute'],
      summary: 'Queue code for execution',
      description: 'Answers at once. With an idempotency_key, a repeated submission of the same payload returns the existing job (200, created=false).',
      responses: {
        202: jsonResponse('Queued', SubmissionSchema),
        200: jsonResponse('Idempotent replay: the existing job and its current status', SubmissionSchema),
        ...errorResponses(400),
        409: jsonResponse('The idempotency key was used with a different payload', IdempotencyConflictSchema),
        ...errorResponses(413, 415, 503),
      },
    }),
    bodyValidator(schemas.async, limit, refuseWhenStopping),
    async (c) => {
      const body = c.req.valid('json');
      const meta = requestMeta(c);
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
    },
  );

  return app;
}
