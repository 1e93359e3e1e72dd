/**
 * The cluster egress proxy's probe endpoint, on its own port so that run pods (which may reach only
 * the proxy port) never see it. Plain node:http: two fixed routes need no framework.
 * - `GET /livez`: 200 while the process serves.
 * - `GET /readyz`: 200 `{"status":"ready",…}`, or 503 `{"status":"saturated",…}` while the connections
 *   past their head or those still sending one are at their cap, so a saturated replica leaves the
 *   Service's endpoints until it has room again. The body carries the counts.
 */
import http from 'node:http';
import type { AdmissionStats } from './admission.ts';

export interface EgressHealthServer {
  port: number;
  close(): Promise<void>;
}

/** Serves /livez and /readyz on `host:port` (0: any free port), reading `stats` on each request. */
export async function startEgressHealthServer(port: number, host: string, stats: () => AdmissionStats): Promise<EgressHealthServer> {
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0];
    const send = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' });
      res.end(`${JSON.stringify(body)}\n`);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, { detail: 'GET only' });
    if (path === '/livez') return send(200, { status: 'ok' });
    if (path === '/readyz') {
      const s = stats();
      return send(s.saturated ? 503 : 200, { status: s.saturated ? 'saturated' : 'ready', admitted: s.admitted, pending: s.pending, max_connections: s.maxConnections, max_pending: s.maxPending });
    }
    return send(404, { detail: 'not found' });
  });
  // A probe that stalls must not pin a socket.
  server.requestTimeout = 5000;
  server.headersTimeout = 5000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as { port: number }).port,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
