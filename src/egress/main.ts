/**
 * Entry point of the cluster's egress proxy (`node dist/egress/main.js` in the service image).
 * Environment:
 * - `SANDPOD_EGRESS_KEY_FILE`: file holding the HMAC key shared with the service (required);
 * - `SANDPOD_EGRESS_PORT` (default 3128) and `SANDPOD_EGRESS_HOST` (default 0.0.0.0);
 * - `SANDPOD_EGRESS_HEALTH_PORT` (default 8081): `/livez` and `/readyz` (health.ts), 0 for none;
 * - `SANDPOD_EGRESS_MAX_CONNECTIONS` (default 1024): connections past their request head, all runs;
 * - `SANDPOD_EGRESS_MAX_CONNECTIONS_PER_RUN` (default 64): the same, of one run (one credential);
 * - `SANDPOD_EGRESS_MAX_PENDING` (default: MAX_CONNECTIONS) and `SANDPOD_EGRESS_MAX_PENDING_PER_SOURCE`
 *   (default 64): connections still sending their head, in total and from one pod address;
 * - `SANDPOD_EGRESS_HEAD_TIMEOUT_MS` (default 10000): time to send a whole request head;
 * - `SANDPOD_EGRESS_IDLE_TIMEOUT_MS` (default 300000): a tunnel or request with no traffic is closed;
 * - `SVC_LOG_LEVEL`, `SVC_LOG_FORMAT`.
 * SIGTERM and SIGINT close the listeners and every connection.
 */
import { readFileSync } from 'node:fs';
import { createLogger, type LogFormat } from '../logger.ts';
import { startClusterEgressProxy } from './cluster.ts';
import { startEgressHealthServer } from './health.ts';
import { MIN_KEY_BYTES } from './token.ts';

function intEnv(name: string, fallback: number, min = 0): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name}: must be ${min === 0 ? 'a non-negative' : 'a positive'} integer, got ${JSON.stringify(raw)}`);
  return n;
}

async function main(): Promise<void> {
  const log = createLogger(process.env.SVC_LOG_LEVEL ?? 'info', (process.env.SVC_LOG_FORMAT as LogFormat | undefined) ?? 'json').child({ component: 'egress-proxy' });
  const keyFile = process.env.SANDPOD_EGRESS_KEY_FILE;
  if (!keyFile) throw new Error('SANDPOD_EGRESS_KEY_FILE is not set');
  const key = readFileSync(keyFile, 'utf8').trim();
  if (Buffer.byteLength(key) < MIN_KEY_BYTES) throw new Error(`${keyFile}: the key needs at least ${MIN_KEY_BYTES} bytes`);
  const port = intEnv('SANDPOD_EGRESS_PORT', 3128);
  const healthPort = intEnv('SANDPOD_EGRESS_HEALTH_PORT', 8081);
  const host = process.env.SANDPOD_EGRESS_HOST || '0.0.0.0';
  const maxConnections = intEnv('SANDPOD_EGRESS_MAX_CONNECTIONS', 1024, 1);
  const proxy = await startClusterEgressProxy({
    key,
    port,
    host,
    logger: log,
    maxConnections,
    maxConnectionsPerRun: intEnv('SANDPOD_EGRESS_MAX_CONNECTIONS_PER_RUN', 64, 1),
    maxPendingConnections: intEnv('SANDPOD_EGRESS_MAX_PENDING', maxConnections, 1),
    maxPendingPerSource: intEnv('SANDPOD_EGRESS_MAX_PENDING_PER_SOURCE', 64, 1),
    headTimeoutMs: intEnv('SANDPOD_EGRESS_HEAD_TIMEOUT_MS', 10_000, 1),
    idleTimeoutMs: intEnv('SANDPOD_EGRESS_IDLE_TIMEOUT_MS', 300_000, 1),
  });
  const health = healthPort === 0 ? null : await startEgressHealthServer(healthPort, host, () => proxy.stats());
  log.info({ host, port: proxy.port, health_port: health?.port ?? null }, 'egress proxy listening');
  const stop = () => {
    log.info('egress proxy stopping');
    void Promise.all([proxy.close(), health?.close()]).then(() => process.exit(0));
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

main().catch((err: unknown) => {
  process.stderr.write(`sandpod egress proxy: ${(err as Error).message}\n`);
  process.exit(1);
});
