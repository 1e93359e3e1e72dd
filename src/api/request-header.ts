/**
 * A request header, read from Node's IncomingMessage when there is one. `c.req.header()` builds a
 * WHATWG Headers object of every header on first use, which is a measurable part of a small request's
 * cost; the raw headers are already parsed (and lower-cased) by Node. Under `app.request()` (tests)
 * there is no IncomingMessage and hono's own accessor answers.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Context } from 'hono';

/** The IncomingMessage behind a request served by @hono/node-server, if any. */
export function incomingOf(c: Context): IncomingMessage | undefined {
  return (c.env as { incoming?: IncomingMessage } | undefined)?.incoming;
}

/**
 * Aborts when the client goes away before its answer is written (the connection closed first), as
 * `c.req.raw.signal` does, without it: on @hono/node-server that getter builds a whole WHATWG
 * Request (its headers copied, its body wrapped in a web stream), about a fifth of a millisecond on
 * a sync run's path. Off the Node server (`app.request` in tests) it is the request's own signal.
 */
export function clientGoneSignal(c: Context): AbortSignal {
  const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
  if (!outgoing) return c.req.raw.signal;
  const gone = new AbortController();
  outgoing.once('close', () => {
    if (!outgoing.writableFinished) gone.abort(new Error('the client closed the connection'));
  });
  return gone.signal;
}

/** The header `name` (lower case), joined with ", " when repeated, like `Headers.get`. */
export function requestHeader(c: Context, name: string): string | undefined {
  const incoming = incomingOf(c);
  if (!incoming) return c.req.header(name);
  const value = incoming.headers[name];
  return Array.isArray(value) ? value.join(', ') : value;
}
