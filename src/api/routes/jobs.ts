/**
 * Jobs (SPEC §4.3–§4.8): status, result with long-poll, cancel, rerun, fork, artifacts.
 */
import { Hono } from 'hono';
import * as v from 'valibot';
import { AppError } from '../../errors.ts';
import type { SubmittedJob } from '../../executions/service.ts';
import { inputArtifactFiles, recordView } from '../../executions/views.ts';
import { getArtifact, listArtifacts } from '../../store/artifacts.repository.ts';
import type { ExecutionRow } from '../../store/database.ts';
import { getExecution, queuePosition, TERMINAL_STATUSES } from '../../store/executions.repository.ts';
import { clientIp } from '../client-ip.ts';
import { requestHeader } from '../request-header.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { requestSchemas } from '../schemas.ts';
import { boolParam, intParam, jsonBody, query, viewParam } from '../validate.ts';
import { queueStatus } from './execute.ts';

const isTerminal = (s: string) => (TERMINAL_STATUSES as readonly string[]).includes(s);

const ResultQuery = v.object({ wait: boolParam('wait'), timeout: intParam('timeout', 1, 300, 30), view: viewParam });
const ViewQuery = v.object({ view: viewParam });

export function jobRoutes(deps: AppDeps) {
  const schemas = requestSchemas(deps.config);
  const app = new Hono<AppEnv>();
  const db = deps.db.kysely;

  /** The record view of a row, with artifact metadata when full. */
  async function fullView(row: ExecutionRow, full: boolean) {
    return recordView(row, full, full ? await listArtifacts(db, row.id) : []);
  }

  async function mustGet(id: string): Promise<ExecutionRow> {
    const row = await getExecution(db, id);
    if (!row) throw new AppError('not_found', `job '${id}' not found`);
    return row;
  }

  app.get('/jobs/:id', async (c) => {
    const { view } = query(c, ViewQuery);
    const row = await mustGet(c.req.param('id'));
    if (view === 'full') return c.json(await fullView(row, true));
    return c.json({
      job_id: row.id,
      status: row.status,
      job_type: row.job_type,
      created_at: new Date(row.created_at).toISOString(),
      started_at: row.started_at ? new Date(row.started_at).toISOString() : null,
      ended_at: row.ended_at ? new Date(row.ended_at).toISOString() : null,
    });
  });

  app.get('/jobs/:id/result', async (c) => {
    const q = query(c, ResultQuery);
    const id = c.req.param('id');
    let row = await mustGet(id);
    if (!isTerminal(row.status) && q.wait) row = (await deps.waiter.wait(id, q.timeout * 1000, c.req.raw.signal)) ?? row;
    if (isTerminal(row.status)) return c.json(await fullView(row, q.view === 'full'));
    if (q.wait) {
      throw new AppError('wait_timeout', `job '${id}' did not finish within ${q.timeout} s; it is still ${row.status}`, {
        job_id: id,
        status: queueStatus(row.status),
      });
    }
    const position = row.status === 'queued' ? await queuePosition(db, id) : 0;
    return c.json(
      {
        job_id: id,
        status: queueStatus(row.status),
        message: row.status === 'queued' ? `job is waiting for a worker (position ${position ?? '?'} in the queue)` : 'job is running',
        queue_position: position ?? 0,
      },
      202,
    );
  });

  app.post('/jobs/:id/cancel', async (c) => {
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
  });

  app.post('/jobs/:id/rerun', async (c) => {
    const meta = { correlationId: c.get('correlationId'), clientIp: clientIp(c) };
    const row = await deps.executions.rerun(c.req.param('id'), meta);
    return c.json(lineageView(row), 202);
  });

  app.post('/jobs/:id/fork', async (c) => {
    const body = await jsonBody(c, schemas.fork, { limit: deps.config.max_body_bytes });
    const meta = { correlationId: c.get('correlationId'), clientIp: clientIp(c) };
    const row = await deps.executions.fork(c.req.param('id'), body.code, meta);
    return c.json(lineageView(row), 202);
  });

  // Hono serves HEAD with the GET handler; it answers the headers without reading the bytes.
  app.get('/jobs/:id/artifacts/:name', async (c) => {
    const head = c.req.method === 'HEAD';
    const id = c.req.param('id');
    const name = c.req.param('name');
    checkArtifactName(name);
    const row = await mustGet(id);
    let file: { data: Buffer | null; sha256: string; contentType: string; size: number } | undefined;
    const input = inputArtifactFiles(row).find((f) => f.view.name === name);
    if (input) file = { data: input.data, sha256: input.view.sha256, contentType: input.view.content_type, size: input.view.size_bytes };
    else {
      const a = await getArtifact(db, id, name, !head);
      if (a) file = { data: a.data, sha256: a.sha256, contentType: a.content_type, size: Number(a.size_bytes) };
    }
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
  });

  return app;
}

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
