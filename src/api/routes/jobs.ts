/**
 * Jobs (SPEC §4.3–§4.8): status, result with long-poll, cancel, rerun, fork, artifacts.
 */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import { AppError } from '../../errors.ts';
import type { StoredRecord } from '../../executions/history.ts';
import { isTerminal, queueStatus, type SubmittedJob } from '../../executions/index.ts';
import { requestMeta } from '../request-meta.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { noBody } from '../middleware/body-rules.ts';
import { bodyValidator, errorResponses, jsonResponse, pathParam, queryValidator, type ParamDoc, type ResponseDoc } from '../openapi.ts';
import { clientGoneSignal, requestHeader } from '../request-header.ts';
import {
  AnyRecordSchema,
  FullRecordSchema,
  CancelSchema,
  exactJson,
  JobStatusSchema,
  LineageSchema,
  NotReadySchema,
  WaitTimeoutSchema,
} from '../responses.ts';
import { requestSchemas, ResultQuery, ViewQuery } from '../schemas.ts';
import * as v from 'valibot';

const idParam = pathParam('id', 'Job id (the execution_id)');

/** Sub-app for `/jobs/{id}…`: status, result, cancel, rerun, fork, artifacts. */
export function jobRoutes(deps: AppDeps) {
  const schemas = requestSchemas(deps.config);
  const app = new Hono<AppEnv>();
  const { history } = deps;

  async function mustGet(id: string): Promise<StoredRecord> {
    const row = await history.find(id);
    if (!row) throw new AppError('not_found', `job '${id}' not found`);
    return row;
  }

  app.get(
    '/jobs/:id',
    describeRoute({
      operationId: 'getJob',
      tags: ['jobs'],
      summary: 'Job status',
      description: 'The brief status; view=full gives the whole record (as GET /executions/{id}?view=full).',
      parameters: [idParam],
      responses: { 200: jsonResponse('Status, or the full record with view=full', v.union([JobStatusSchema, FullRecordSchema])), ...errorResponses(400, 404) },
    }),
    queryValidator(ViewQuery),
    async (c) => {
      const { view } = c.req.valid('query');
      const row = await mustGet(c.req.param('id'));
      if (view === 'full') return exactJson(c, await history.recordOf(row, true));
      return c.json(history.statusOf(row));
    },
  );

  app.get(
    '/jobs/:id/result',
    describeRoute({
      operationId: 'getJobResult',
      tags: ['jobs'],
      summary: 'Job result; wait=true long-polls',
      parameters: [idParam],
      responses: {
        200: jsonResponse('The finished job\'s record (extended with view=full)', AnyRecordSchema),
        202: jsonResponse('Not finished yet (wait=false)', NotReadySchema),
        ...errorResponses(400, 404),
        408: jsonResponse('wait=true and the job did not finish within timeout seconds', WaitTimeoutSchema),
      },
    }),
    queryValidator(ResultQuery),
    async (c) => {
      const q = c.req.valid('query');
      const id = c.req.param('id');
      let row = await mustGet(id);
      if (!isTerminal(row.status) && q.wait) row = (await deps.waiter.wait(id, q.timeout * 1000, clientGoneSignal(c))) ?? row;
      if (isTerminal(row.status)) return exactJson(c, await history.recordOf(row, q.view === 'full'));
      if (q.wait) {
        throw new AppError('wait_timeout', `job '${id}' did not finish within ${q.timeout} s; it is still ${row.status}`, {
          job_id: id,
          status: queueStatus(row.status),
        });
      }
      const position = row.status === 'queued' ? await history.queuePosition(id) : 0;
      return c.json(
        {
          job_id: id,
          status: queueStatus(row.status),
          message: row.status === 'queued' ? `job is waiting for a worker (position ${position ?? '?'} in the queue)` : 'job is running',
          queue_position: position ?? 0,
        },
        202,
      );
    },
  );

  app.post(
    '/jobs/:id/cancel',
    describeRoute({
      operationId: 'cancelJob',
      tags: ['jobs'],
      summary: 'Cancel a queued or running job',
      description: 'A running job is killed; the answer waits up to 10 s for it to stop. Cancelling a cancelled job is 200.',
      parameters: [idParam],
      responses: {
        200: jsonResponse('Cancelled (or it finished first: its real status)', CancelSchema),
        202: jsonResponse('Cancellation requested; the run has not stopped yet', CancelSchema),
        ...errorResponses(404, 409),
      },
    }),
    noBody(),
    async (c) => {
      const id = c.req.param('id');
      const before = await mustGet(id);
      const row = await deps.executions.cancel(id, 10_000, (jobId, ms) => deps.waiter.wait(jobId, ms));
      const settled = isTerminal(row.status);
      return c.json(
        {
          job_id: id,
          status: settled ? row.status : 'cancelling',
          previous_status: queueStatus(before.status),
          message: settled
            ? row.status === 'cancelled'
              ? 'job cancelled'
              : `job finished with status '${row.status}' before the cancellation took effect`
            : 'cancellation requested; the job will stop shortly',
        },
        settled ? 200 : 202,
      );
    },
  );

  app.post(
    '/jobs/:id/rerun',
    describeRoute({
      operationId: 'rerunJob',
      tags: ['jobs'],
      summary: 'Run a finished job again',
      description: 'A new job with the same code, input, job type, timeouts, requirements and callback. An optional body may name another callback_url (null: none).',
      parameters: [idParam],
      responses: { 202: jsonResponse('Queued', LineageSchema), ...errorResponses(400, 404, 409, 415, 503) },
    }),
    bodyValidator(schemas.rerun, deps.config.max_body_bytes, undefined, true),
    async (c) => {
      const body = c.req.valid('json');
      const meta = requestMeta(c);
      const row = await deps.executions.rerun(c.req.param('id'), meta, body.callback_url);
      return c.json(lineageView(row), 202);
    },
  );

  app.post(
    '/jobs/:id/fork',
    describeRoute({
      operationId: 'forkJob',
      tags: ['jobs'],
      summary: 'Run new code with a finished job\'s input and settings',
      parameters: [idParam],
      responses: { 202: jsonResponse('Queued', LineageSchema), ...errorResponses(400, 404, 409, 413, 415, 503) },
    }),
    bodyValidator(schemas.fork, deps.config.max_body_bytes),
    async (c) => {
      const body = c.req.valid('json');
      const meta = requestMeta(c);
      const row = await deps.executions.fork(c.req.param('id'), body.code, meta, body.callback_url);
      return c.json(lineageView(row), 202);
    },
  );

  const artifactParams = [idParam, pathParam('name', 'Artifact file name, or _code.py / _input.json for the inputs'), IF_NONE_MATCH];
  const artifactDoc = (head: boolean): { tags: string[]; parameters: ParamDoc[]; responses: Record<string, ResponseDoc> } => ({
    tags: ['jobs'],
    parameters: artifactParams,
    responses: {
      200: {
        description: head ? 'The headers of the file, no body' : 'The file',
        headers: ARTIFACT_HEADERS,
        ...(head ? {} : { content: { 'application/octet-stream': { schema: { type: 'string' as const, contentMediaType: 'application/octet-stream', description: 'The bytes; Content-Type says what they are' } } } }),
      },
      304: { description: 'Not modified: If-None-Match matched the ETag', headers: { ETag: ARTIFACT_HEADERS.ETag! } },
      ...(head ? { 400: { description: 'Invalid artifact name' }, 404: { description: 'No such job or artifact' } } : errorResponses(400, 404)),
    },
  });

  // Hono answers HEAD with the GET handler (it never dispatches a HEAD route), so this one only
  // documents the HEAD operation; the GET handler below reads no bytes for a HEAD request.
  app.on('HEAD', '/jobs/:id/artifacts/:name', describeRoute({ operationId: 'headArtifact', summary: 'Artifact headers only', ...artifactDoc(true) }), (c) => c.body(null));

  app.get(
    '/jobs/:id/artifacts/:name',
    describeRoute({ operationId: 'getArtifact', summary: 'Download an artifact', description: 'Supports If-None-Match (lists, W/ and *).', ...artifactDoc(false) }),
    async (c) => {
      const head = c.req.method === 'HEAD';
      const id = c.req.param('id');
      const name = c.req.param('name');
      checkArtifactName(name);
      const row = await mustGet(id);
      const file = await history.artifact(row, name, !head);
      if (!file) throw new AppError('not_found', `job '${id}' has no artifact named '${name}'`);
      const etag = `"${file.sha256}"`;
      const headers: Record<string, string> = {
        'Content-Type': file.contentType,
        ETag: etag,
        'Content-Disposition': contentDisposition(name),
        'Cache-Control': 'private, max-age=0, must-revalidate',
      };
      if (etagMatches(requestHeader(c, 'if-none-match'), file.sha256)) return c.body(null, 304, headers);
      headers['Content-Length'] = String(file.size);
      if (head) return c.body(null, 200, headers);
      return c.body(new Uint8Array(file.data ?? Buffer.alloc(0)), 200, headers);
    },
  );

  return app;
}

const IF_NONE_MATCH: ParamDoc = {
  name: 'If-None-Match',
  in: 'header',
  description: 'ETags seen before (a list, W/ prefixes and * are understood)',
  schema: { type: 'string' },
};

const ARTIFACT_HEADERS: Record<string, { description: string; schema: { type: 'string' | 'integer'; minimum?: number; pattern?: string } }> = {
  'Content-Type': { description: 'MIME type of the file', schema: { type: 'string' } },
  'Content-Length': { description: 'Size in bytes', schema: { type: 'integer', minimum: 0 } },
  ETag: { description: 'The quoted sha256 of the content', schema: { type: 'string', pattern: '^"[0-9a-f]{64}"$' } },
  'Content-Disposition': { description: 'attachment; filename="…"; filename*=UTF-8\'\'…', schema: { type: 'string' } },
};

function lineageView(row: SubmittedJob) {
  return {
    job_id: row.id,
    status: queueStatus(row.status),
    parent_execution_id: row.parent_execution_id,
    relationship: row.relationship,
  };
}

/** Artifact names are single file names: no separators, no NUL, no dot-dot, bounded length. */
export function checkArtifactName(name: string): void {
  if (name.length === 0 || name.length > 255 || name === '.' || name === '..' || /[/\\\u0000-\u001f]/.test(name)) {
    throw new AppError('bad_request', `invalid artifact name ${JSON.stringify(name)}: must be a plain file name`);
  }
}

/** RFC 6266 attachment with an ASCII fallback and the UTF-8 name. */
export function contentDisposition(name: string): string {
  const ascii = name.replace(/[^\x20-\x7e]/g, '_').replace(/["\\]/g, '_');
  return `attachment; filename="${ascii}"; filename*=UTF-8''${encodeURIComponent(name)}`;
}

/** `If-None-Match` handling: `*`, lists, weak validators. */
export function etagMatches(header: string | undefined, sha: string): boolean {
  if (!header) return false;
  if (header.trim() === '*') return true;
  return header.split(',').some((t) => t.trim().replace(/^W\//, '') === `"${sha}"`);
}

