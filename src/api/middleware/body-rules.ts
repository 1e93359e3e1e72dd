/**
 * What a request body may be (issue 22 item 7, issue 23 item 4).
 *
 * - Every request with a body must say `Content-Type: application/json` (415 otherwise), checked
 *   before any of it is read: a cross-site form or `text/plain` POST — which a browser sends without
 *   asking — is refused whatever the route.
 * - A route that takes no body (cancel, rerun, DELETE) refuses one (400) instead of ignoring it.
 * - A body left unread by an early answer (413 from Content-Length, 415, 401, 403…) is read and
 *   discarded, up to a bound, before the connection is closed: a client that writes its whole
 *   request before reading the answer (Python's http.client, requests, urllib) then reads the answer
 *   instead of a broken pipe. @hono/node-server's own clean-up gives up after 500 ms, too soon for a
 *   late or slow client, so the server runs with `autoCleanupIncoming: false` (main.ts `listen`) and
 *   this does it instead.
 */
import type { IncomingMessage } from 'node:http';
import type { Context, MiddlewareHandler } from 'hono';
import { AppError } from '../../errors.ts';
import type { AppEnv } from '../deps.ts';
import { incomingOf, requestHeader } from '../request-header.ts';

/** Whether `type` is a JSON media type (`application/json`, `application/problem+json`, parameters allowed). */
export function isJsonType(type: string | undefined): boolean {
  return type !== undefined && /^application\/(.+\+)?json\s*(;|$)/i.test(type.trim());
}

/** Whether the request carries a body (a non-zero Content-Length or a chunked one). */
export function hasBody(c: Context): boolean {
  const incoming = incomingOf(c);
  if (!incoming) return c.req.raw.body !== null;
  const length = incoming.headers['content-length'];
  if (length !== undefined) return Number(length) !== 0;
  return incoming.headers['transfer-encoding'] !== undefined;
}

/** 415 for a request with a body that is not JSON (every route: no route takes anything else). */
export function jsonBodiesOnly(): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const m = c.req.method;
    if (m !== 'GET' && m !== 'HEAD' && hasBody(c)) {
      const type = requestHeader(c, 'content-type');
      // A session file's bytes (PUT /sessions/{id}/files/{name}, issue 19): raw, as octet-stream only,
      // a type no browser sends cross-site without asking first (like JSON).
      if (m === 'PUT' && /^application\/octet-stream\s*(;|$)/i.test(type?.trim() ?? '') && c.req.path.includes('/files/')) return next();
      if (!isJsonType(type)) throw new AppError('unsupported_media_type', `Content-Type must be application/json, got '${(type ?? '(none)').slice(0, 100)}'`);
    }
    return next();
  };
}

/** For a route that takes no body: 400 when one is sent. */
export function noBody(): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    if (hasBody(c)) throw new AppError('bad_request', `${c.req.method} ${c.req.routePath} takes no request body; send none`);
    return next();
  };
}

/** Bounds of {@link discardUnread}. */
export interface DiscardBounds {
  /** Bytes read and thrown away at most; past them the connection is closed. */
  maxBytes: number;
  /** Time spent at most, ms; past it the connection is closed (a client that stalls). */
  maxMs: number;
}

/**
 * Reads and throws away what is left of a request's body; closes the connection when the client sends
 * more than `maxBytes` or takes longer than `maxMs`. A no-op when the body was read (or there is none).
 */
export function discardUnread(incoming: IncomingMessage, bounds: DiscardBounds): void {
  if (incoming.complete || incoming.readableEnded || incoming.destroyed) return;
  let read = 0;
  const finish = (close: boolean) => {
    clearTimeout(timer);
    incoming.off('data', onData);
    incoming.off('end', onEnd);
    incoming.off('error', onEnd);
    if (close) incoming.socket?.destroy();
  };
  const onData = (chunk: Buffer) => {
    read += chunk.length;
    if (read > bounds.maxBytes) finish(true);
  };
  const onEnd = () => finish(false);
  const timer = setTimeout(() => finish(true), bounds.maxMs);
  timer.unref?.();
  incoming.on('data', onData);
  incoming.once('end', onEnd);
  incoming.once('error', onEnd);
  incoming.resume();
}

/** How long an unread body is waited for: long enough for a client a few seconds late or slow. */
export const DISCARD_MS = 30_000;

/**
 * Discards, after the answer, any body the route left unread: up to twice `maxBodyBytes` (at least
 * 8 MiB) and {@link DISCARD_MS}.
 */
export function discardUnreadBodies(maxBodyBytes: number): MiddlewareHandler<AppEnv> {
  const bounds = { maxBytes: Math.max(2 * maxBodyBytes, 8 * 1024 * 1024), maxMs: DISCARD_MS };
  return async (c, next) => {
    try {
      await next();
    } finally {
      const incoming = incomingOf(c);
      if (incoming && c.req.method !== 'GET' && c.req.method !== 'HEAD') discardUnread(incoming, bounds);
    }
  };
}
