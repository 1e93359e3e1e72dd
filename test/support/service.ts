/**
 * A real service for integration tests: real database (PostgreSQL or PGlite), real local sandbox
 * (bubblewrap by default: the fastest real isolation here; the sandbox suite covers gVisor too).
 */
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import { afterAll, beforeAll } from 'vitest';
import { parseConfig, type Config } from '../../src/config.ts';
import { silentLogger } from '../../src/logger.ts';
import { createService, listen, type Service, type ServiceOverrides } from '../../src/main.ts';
import { freshDatabase, type TestDatabase } from './db.ts';

/** A running test service and its database. */
export interface TestService extends Service {
  database: TestDatabase;
  /** `app.request` with a JSON body. */
  post(path: string, body?: unknown, headers?: Record<string, string>): Promise<Response>;
  get(path: string, headers?: Record<string, string>): Promise<Response>;
  close(): Promise<void>;
}

/** Starts a service on a fresh database. `config` is merged over test defaults. */
export async function startTestService(config: Record<string, unknown> = {}, overrides: ServiceOverrides = {}, database?: TestDatabase): Promise<TestService> {
  const db = database ?? (await freshDatabase());
  const cfg: Config = parseConfig(
    {
      sandbox_engine: process.env.SANDPOD_TEST_ENGINE ?? 'bubblewrap',
      max_workers: 2,
      log_level: 'silent',
      shutdown_grace_seconds: 5,
      retry: { attempts: 2, base_delay_ms: 10 },
      ...config,
      workspace: db.workspace,
      ...(db.url ? { database_url: db.url } : {}),
    },
    {},
  );
  const service = await createService(cfg, { logger: silentLogger, heartbeatMs: 500, pollMs: 200, ...overrides });
  await service.start();
  let stopped = false;
  return {
    ...service,
    database: db,
    post: (p, body, headers = {}) =>
      Promise.resolve(
        service.app.request(p, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...headers },
          ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }),
        }),
      ),
    get: (p, headers = {}) => Promise.resolve(service.app.request(p, { headers })),
    async close() {
      if (stopped) return;
      stopped = true;
      // A stop that hangs (seen once in CI, on PGlite, not reproduced) says which step it waits on,
      // before the hook's timeout ends the file without a word.
      const watchdog = setInterval(() => process.stderr.write(`test service: stop still waiting on its '${service.stopStep() ?? '?'}' step\n`), 20_000);
      try {
        await service.stop(2000);
      } finally {
        clearInterval(watchdog);
      }
      if (!database) await db.drop();
    },
  };
}

export { listen };

/**
 * A test service listening on a free loopback port, for the tests of the calling `describe`: started
 * before them, stopped after. Read `svc` and `url` inside the tests (they are set by then).
 */
export function useServedService(config: Record<string, unknown> = {}): { readonly svc: TestService; readonly url: string } {
  const t = {} as { svc: TestService; url: string; server?: ServerType };
  beforeAll(async () => {
    t.svc = await startTestService(config);
    t.server = await listen(t.svc, 0, '127.0.0.1');
    t.url = `http://127.0.0.1:${(t.server.address() as AddressInfo).port}`;
  }, 120_000);
  afterAll(async () => {
    const server = t.server;
    if (server) await new Promise<void>((r) => server.close(() => r()));
    await t.svc?.close();
  });
  return t;
}
