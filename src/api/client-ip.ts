/** The caller's address: the first `X-Forwarded-For` hop (set by the ingress), else the socket peer. */
import { getConnInfo } from '@hono/node-server/conninfo';
import type { Context } from 'hono';
import { requestHeader } from './request-header.ts';

export function clientIp(c: Context): string | null {
  const xff = requestHeader(c, 'x-forwarded-for');
  if (xff) {
    const first = xff.split(',')[0]?.trim();
    if (first) return first.slice(0, 64);
  }
  try {
    return getConnInfo(c).remote.address ?? null;
  } catch {
    return null; // app.request() in tests has no socket
  }
}
