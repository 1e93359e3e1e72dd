/**
 * Wiring only: config → database (migrated) → job types → runtime → lifecycle → API + dispatcher.
 * SIGTERM: stop taking work, let running jobs finish within `shutdown_grace_seconds`, return the rest
 * to the queue, exit.
 */
import { readFileSync } from 'node:fs';
import { serve, type ServerType } from '@hono/node-server';
import { createApp } from './api/app.ts';
import { ConfigError, loadConfig, type Config } from './config.ts';
import { systemClock, type Clock } from './clock.ts';
import { CompletionWaiter, Executions } from './executions/index.ts';
import { History } from './executions/history.ts';
import { createJobTypeRegistry } from './jobtypes/index.ts';
import type { JobTypeRegistry } from './jobtypes/job-type.ts';
import { createLogger, type Logger } from './logger.ts';
import { Metrics } from './metrics.ts';
import { QUEUED_CHANNEL } from './queue/channels.ts';
import { Dispatcher } from './queue/dispatcher.ts';
import { Slots } from './queue/slots.ts';
import { CircuitBreaker } from './resilience/breaker.ts';
import { RunGuard } from './resilience/guard.ts';
import { createRuntime } from './runtime/index.ts';
import type { Runtime } from './runtime/runtime.ts';
import { createDb, DatabaseConnectError, type Db } from './store/database.ts';
import { liveIds } from './store/executions.repository.ts';
import { migrateToLatest } from './store/migrate.ts';

/** The service version (package.json). */
export const VERSION: string = (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version;

/** Overrides for tests and tools. */
export interface ServiceOverrides {
  logger?: Logger;
  /** Wraps or replaces the configured runtime (fault injection in tests). */
  runtime?: Runtime | ((real: () => Promise<Runtime>) => Promise<Runtime>);
  registry?: JobTypeRegistry;
  db?: Db;
  /** The service's clock (`Date.now` by default): breaker timing, record times, heartbeats. */
  now?: () => number;
  /** Sleep between run attempts (tests make it instant). */
  sleep?: (ms: number) => Promise<void>;
  heartbeatMs?: number;
  pollMs?: number;
}

/** A wired service, not yet listening. */
export interface Service {
  config: Config;
  app: ReturnType<typeof createApp>;
  db: Db;
  executions: Executions;
  runtime: Runtime;
  breaker: CircuitBreaker;
  dispatcher: Dispatcher<unknown>;
  metrics: Metrics;
  logger: Logger;
  /** Starts the runtime, settles orphans, starts the dispatcher. */
  start(): Promise<void>;
  /** Graceful stop: refuse new work, drain within the grace, requeue the rest, close everything. */
  stop(graceMs?: number): Promise<void>;
}

/** Wires the service from a configuration. */
export async function createService(config: Config, o: ServiceOverrides = {}): Promise<Service> {
  const logger = o.logger ?? createLogger(config.log_level);
  const db = o.db ?? (await createDb({ url: config.database_url, workspace: config.workspace, poolSize: config.max_workers + 10 }));
  await migrateToLatest(db.kysely);
  const metrics = new Metrics({ defaultMetrics: true });
  const clock: Clock = o.now ? { now: o.now } : systemClock;
  const breaker = new CircuitBreaker({
    failureThreshold: config.breaker.failure_threshold,
    recoveryTimeoutMs: config.breaker.recovery_timeout_ms,
    successThreshold: config.breaker.success_threshold,
    clock,
    onStateChange: (from, to) => logger.warn({ from, to }, 'circuit breaker state changed'),
  });
  // The one guard policy: applied by the lifecycle around each run attempt, for every runtime.
  const runGuard = new RunGuard({
    breaker,
    policy: { attempts: config.retry.attempts, baseDelayMs: config.retry.base_delay_ms },
    ...(o.sleep ? { sleep: o.sleep } : {}),
  });
  const registry: JobTypeRegistry = o.registry ?? (await createJobTypeRegistry(config, { logger }));
  const hooks = { liveExecutionIds: (ids: string[]) => liveIds(db.kysely, ids) };
  const real = () => createRuntime(config, { logger, hooks });
  const runtime = typeof o.runtime === 'function' ? await o.runtime(real) : (o.runtime ?? (await real()));
  const slots = new Slots(config.max_workers);
  const executions = new Executions({
    db,
    registry,
    runtime,
    guard: runGuard,
    config,
    logger,
    slots,
    clock,
    ...(o.heartbeatMs ? { heartbeatMs: o.heartbeatMs } : {}),
    events: { onStarted: (r) => metrics.started(r), onFinished: (r) => metrics.finished(r) },
  });
  const waiter = new CompletionWaiter(db);
  const dispatcher = new Dispatcher({
    target: executions,
    slots,
    logger,
    subscribe: (wake) => db.listen(QUEUED_CHANNEL, wake),
    ...(o.pollMs ? { pollMs: o.pollMs } : {}),
  });
  let shuttingDown = false;
  const app = createApp({ config, history: new History(db), executions, waiter, registry, runtime, breaker, slots, logger, metrics, version: VERSION, isShuttingDown: () => shuttingDown });

  return {
    config,
    app,
    db,
    executions,
    runtime,
    breaker,
    dispatcher: dispatcher as Dispatcher<unknown>,
    metrics,
    logger,
    async start() {
      await runtime.start();
      await registry.start?.();
      await executions.start();
      await waiter.start();
      const adopted = await executions.recoverOrphans();
      if (adopted.length > 0) logger.warn({ count: adopted.length }, 'settling runs left by a previous process');
      if (config.dispatch) await dispatcher.start();
    },
    async stop(graceMs = config.shutdown_grace_seconds * 1000) {
      shuttingDown = true;
      const finished = await dispatcher.stop(graceMs);
      if (!finished) {
        logger.warn('grace period over; returning unfinished jobs to the queue');
        executions.abortAll();
        await dispatcher.drained();
      }
      await executions.stop();
      await waiter.stop();
      await registry.stop?.();
      await runtime.stop();
      await db.destroy();
    },
  };
}

/** Starts the HTTP server for a service. */
export function listen(service: Service, port = service.config.port, host = service.config.host): Promise<ServerType> {
  return new Promise((resolve) => {
    const server = serve({ fetch: service.app.fetch, port, hostname: host }, () => resolve(server));
  });
}

async function main(): Promise<void> {
  let config: Config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`sandpod: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  const logger = createLogger(config.log_level);
  const service = await createService(config, { logger });
  await service.start();
  const server = await listen(service);
  const health = await service.runtime.health();
  logger.info({ port: config.port, database: service.db.kind, runtime: config.runtime, engine: health.engine, isolated: health.isolated, version: VERSION }, 'sandpod listening');
  if (!health.isolated) logger.warn('the process engine gives NO isolation: use it for development only');

  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'shutting down: no new work; waiting for running jobs');
    const closed = new Promise<void>((r) => server.close(() => r()));
    await service.stop();
    await Promise.race([closed, new Promise((r) => setTimeout(r, 2000))]);
    logger.info('bye');
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((err: unknown) => {
    // An expected start-up failure is one line that says what failed; anything else keeps its stack.
    if (err instanceof DatabaseConnectError) {
      process.stderr.write(`sandpod: failed to start: ${err.message}\n`);
      process.exit(1);
    }
    process.stderr.write(`sandpod: failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
}
