/**
 * The HTTP side of a graceful stop (SIGTERM). The listener stays open while the service drains, so a
 * client that reaches this instance during the drain (a load balancer that has not yet seen the
 * failing readiness probe, a kept-alive connection) gets an answer instead of a refused connection:
 * new submissions 503 `shutting_down` with `Retry-After`, `/health` and `/readyz` 503 saying so,
 * reads of existing jobs served as usual. Only once no run is in flight does the listener stop
 * accepting; requests already on the wire finish, and connections still open after `closeTimeoutMs`
 * (long-polls, event streams) are closed.
 */
import type { Server } from 'node:http';
import type { ServerType } from '@hono/node-server';
import type { Service } from './main.ts';

/** Options of {@link drainAndClose}. */
export interface DrainOptions {
  /** The drain's grace (default: the service's `shutdown_grace_seconds`). */
  graceMs?: number;
  /** How long open connections may linger once the listener is closed. */
  closeTimeoutMs?: number;
}

/** Drains `service` behind a listener that keeps answering, then closes the listener. */
export async function drainAndClose(service: Service, server: ServerType, o: DrainOptions = {}): Promise<void> {
  const http = server as Server;
  let closed: Promise<void> = Promise.resolve();
  const closeListener = () => {
    closed = new Promise<void>((r) => http.close(() => r()));
    http.closeIdleConnections?.();
  };
  await service.stop(o.graceMs, closeListener);
  let timer: NodeJS.Timeout | undefined;
  const lingering = new Promise<void>((r) => {
    timer = setTimeout(() => {
      http.closeAllConnections?.();
      r();
    }, o.closeTimeoutMs ?? 2000);
  });
  await Promise.race([closed, lingering]);
  clearTimeout(timer);
}
