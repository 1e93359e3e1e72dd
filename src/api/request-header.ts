/**
 * A request header, read from Node's IncomingMessage when there is one. `c.req.header()` builds a
 * WHATWG Headers object of every header on first use, which is a measurable part of a small request's
 * cost; the raw headers are already parsed (and lower-cased) by Node. Under `app.request()` (tests)
 * there is no IncomingMessage and hono's own accessor answers.
 */
import type { IncomingMessage } from 'node:http';
import type { Context } from 'hono';

/** The IncomingMessage behind a request served by @hono/node-server, if any. */
export function incomingOf(c: Context): IncomingMessage | undefined {
  return (c.env as { incoming?: IncomingMessage } | undefined)?.incoming;
}

/** The header `name` (lower case), joined with ", " when repeated, like `Headers.get`. */
export function requestHeader(c: Context, name: string): string | undefined {
  const incoming = incomingOf(c);
  if (!incoming) return c.req.header(name);
  const value = incoming.headers[name];
  return Array.isArray(value) ? value.join(', ') : value;
}
