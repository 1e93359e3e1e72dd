/**
 * Entry point of the cluster's egress proxy (`node dist/egress/main.js` in the service image).
 * Environment:
 * - `SANDPOD_EGRESS_KEY_FILE`: file holding the HMAC key shared with the service (required);
 * - `SANDPOD_EGRESS_PORT` (default 3128) and `SANDPOD_EGRESS_HOST` (default 0.0.0.0);
 * - `SANDPOD_EGRESS_MAX_CONNECTIONS` (default 1024), `SVC_LOG_LEVEL`, `SVC_LOG_FORMAT`.
 * SIGTERM and SIGINT close the listener and every connection.
 */
import { readFileSync } from 'node:fs';
import { createLogger, type LogFormat } from '../logger.ts';
import { startClusterEgressProxy } from './cluster.ts';
import { MIN_KEY_BYTES } from './token.ts';

function intEnv(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name}: must be a non-negative integer, got ${JSON.stringify(raw)}`);
  return n;
}

async function main(): Promise<void> {
  const log = createLogger(process.env.SVC_LOG_LEVEL ?? 'info', (process.env.SVC_LOG_FORMAT as LogFormat | undefined) ?? 'json').child({ component: 'egress-proxy' });
  const keyFile = process.env.SANDPOD_EGRESS_KEY_FILE;
  if (!keyFile) throw new Error('SANDPOD_EGRESS_KEY_FILE is not set');
  const key = readFileSync(keyFile, 'utf8').trim();
  if (Buffer.byteLength(key) < MIN_KEY_BYTES) throw new Error(`${keyFile}: the key needs at least ${MIN_KEY_BYTES} bytes`);
  const port = intEnv('SANDPOD_EGRESS_PORT', 3128);
  const host = process.env.SANDPOD_EGRESS_HOST || '0.0.0.0';
  const proxy = await startClusterEgressProxy({ key, port, host, logger: log, maxConnections: intEnv('SANDPOD_EGRESS_MAX_CONNECTIONS', 1024) });
  log.info({ host, port: proxy.port }, 'egress proxy listening');
  const stop = () => {
    log.info('egress proxy stopping');
    void proxy.close().then(() => process.exit(0));
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

main().catch((err: unknown) => {
  process.stderr.write(`sandpod egress proxy: ${(err as Error).message}\n`);
  process.exit(1);
});
