/**
 * `GET /jobs/{id}/events` (issue 12): a run watched live as Server-Sent Events, from any replica,
 * resumable with `Last-Event-ID`. The events come from executions/events.ts; this route parses the
 * resume point, answers 404 for an unknown id, and writes the events with hono's `streamSSE`, one at
 * a time: each write waits until the client took the previous one, so a slow reader slows the reads
 * from the database instead of growing a buffer. Open streams are capped per token and in all
 * (api/stream-limits.ts; 429 past either). `GET /sessions/{id}/events` (issue 19) writes a session's
 * stream (sessions/event-stream.ts) the same way, under the same caps.
 */
import { Hono, type Context } from 'hono';
import { streamSSE } from 'hono/streaming';
import { describeRoute } from 'hono-openapi';
import { AppError } from '../../errors.ts';
import type { FeedItem } from '../../executions/event-feed.ts';
import { parseSessionResume } from '../../sessions/event-stream.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { errorResponses, pathParam } from '../openapi.ts';
import { SHARED_KEY, StreamLimits } from '../stream-limits.ts';

const EVENTS_DOC =
  'Server-Sent Events. Each event has an `id:` (increasing per run, a decimal integer) and a JSON `data:` line. ' +
  '`status` {status, phase: queued|starting|installing|running|finished, at, timing}; `stdout` / `stderr` {data} as the program writes ' +
  '(at most max_stdout_bytes per stream; in the cluster both streams arrive merged as `stdout`); `truncated` {stream} once a stream passes the cap; ' +
  '`artifact` (as in the record); `end` (the full record, as GET /jobs/{id}?view=full), after which the server closes the stream. ' +
  'A `: ping` comment every 15 s. Clients ignore event names they do not know.';

const SESSION_ID_PATTERN = '^[0-9]{1,9}:([0-9]{1,15}|end)$';
const SESSION_EVENTS_DOC =
  'Server-Sent Events. Ids are `{cell}:{n}` (n: the cell\'s run event id) and `{cell}:end`; each has a JSON `data:` line. ' +
  '`cell` {execution_id, cell, status, at} when a cell starts; its run\'s `status`, `stdout` / `stderr` {data}, `truncated` and `artifact` events ' +
  'with `execution_id` and `cell` added; `cell_end` (the cell\'s full record, as GET /jobs/{id}?view=full, plus `cell`) when it ends; ' +
  '`end` (the session, as GET /sessions/{id}) once it has ended, after which the server closes the stream. A `: ping` comment every 15 s.';

/** Routes of the event streams (a job's, a session's); they share the stream caps. */
export function eventRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const limits = new StreamLimits(deps.config.http.max_event_streams, deps.config.http.max_event_streams_per_token);
  app.get(
    '/jobs/:id/events',
    describeRoute({
      operationId: 'getJobEvents',
      tags: ['jobs'],
      summary: 'Watch a job live (Server-Sent Events)',
      description:
        'Status and phase changes, output chunks as the program writes them, artifacts and the final record, then the stream ends. ' +
        'Works whichever replica holds the run; a finished job answers at once. Resume with the `Last-Event-ID` header (or `last_event_id`): ' +
        'events after that id follow.',
      parameters: [
        pathParam('id', 'Job id (the execution_id)'),
        { name: 'Last-Event-ID', in: 'header', required: false, description: 'Resume after this event id', schema: { type: 'string', pattern: '^[0-9]{1,15}$' } },
        { name: 'last_event_id', in: 'query', required: false, description: 'Resume after this event id (for clients that cannot set the header)', schema: { type: 'string', pattern: '^[0-9]{1,15}$' } },
      ],
      responses: {
        200: { description: 'The event stream', content: { 'text/event-stream': { schema: { type: 'string', description: EVENTS_DOC } } } },
        ...errorResponses(400, 404, 429),
      },
    }),
    async (c) => {
      const id = c.req.param('id');
      const after = parseResumeId(c.req.header('last-event-id') ?? c.req.query('last_event_id'));
      const row = await deps.history.find(id);
      if (!row) throw new AppError('not_found', `job '${id}' not found`);
      const feed = deps.events;
      if (!feed) throw new AppError('not_implemented', 'event streams are not available in this service');
      return serve(c, (signal) => feed.stream(row, after, signal), { execution_id: id });
    },
  );

  app.get(
    '/sessions/:id/events',
    describeRoute({
      operationId: 'getSessionEvents',
      tags: ['sessions'],
      summary: "Watch a session's cells live (Server-Sent Events)",
      description:
        'Every cell of the session in order, from the first (or after `Last-Event-ID`), each as its run\'s events tagged with `execution_id` and `cell`; ' +
        'cells started later follow as they start. Once the session has ended and its last cell was sent, an `end` event carries the session, and the stream closes.',
      parameters: [
        pathParam('id', 'Session id'),
        { name: 'Last-Event-ID', in: 'header', required: false, description: 'Resume after this event id', schema: { type: 'string', pattern: SESSION_ID_PATTERN } },
        { name: 'last_event_id', in: 'query', required: false, description: 'Resume after this event id (for clients that cannot set the header)', schema: { type: 'string', pattern: SESSION_ID_PATTERN } },
      ],
      responses: {
        200: { description: 'The event stream', content: { 'text/event-stream': { schema: { type: 'string', description: SESSION_EVENTS_DOC } } } },
        ...errorResponses(400, 404, 429, 501),
      },
    }),
    async (c) => {
      const id = c.req.param('id');
      const sessions = deps.sessions;
      const feed = deps.events;
      if (!sessions || !feed) throw new AppError('not_implemented', 'session event streams are not available in this service');
      const from = parseSessionResume(c.req.header('last-event-id') ?? c.req.query('last_event_id'));
      await sessions.get(id);
      return serve(c, (signal) => sessions.streams.stream(feed, id, from, signal), { session_id: id });
    },
  );

  /** Writes a feed as SSE, one event at a time, under the stream caps. */
  function serve(c: Context<AppEnv>, items: (signal: AbortSignal) => AsyncIterable<FeedItem>, logCtx: Record<string, string>) {
    const ticket = limits.acquire(c.get('principal') ?? SHARED_KEY);
    if ('refused' in ticket) {
      deps.metrics.eventStreamsRefused.inc({ reason: ticket.refused });
      throw new AppError('too_many_requests', ticket.detail);
    }
    deps.metrics.eventStreams.inc();
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      ticket.release();
      deps.metrics.eventStreams.dec();
    };
    c.header('X-Accel-Buffering', 'no');
    return streamSSE(c, async (stream) => {
      const stop = new AbortController();
      stream.onAbort(() => stop.abort());
      const onGone = () => stop.abort();
      c.req.raw.signal.addEventListener('abort', onGone, { once: true });
      try {
        for await (const item of items(stop.signal)) {
          if (stop.signal.aborted) break;
          if ('ping' in item) await stream.write(': ping\n\n');
          else await stream.writeSSE(item);
        }
      } catch (err) {
        c.get('logger')?.warn({ ...logCtx, err: String(err) }, 'event stream ended by an error');
      } finally {
        c.req.raw.signal.removeEventListener('abort', onGone);
        stop.abort();
        release();
      }
    });
  }
  return app;
}

/** The resume point: -1 (from the start) when absent; a decimal event id otherwise; 400 for anything else. */
export function parseResumeId(raw: string | undefined): number {
  if (raw === undefined || raw.trim() === '') return -1;
  const t = raw.trim();
  if (!/^[0-9]{1,15}$/.test(t)) throw new AppError('validation_error', `Last-Event-ID: expected an event id (a decimal integer), got '${t.slice(0, 40)}'`);
  return Number(t);
}
