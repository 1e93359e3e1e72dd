/**
 * Wiring only: config → database (migrated) → job types → runtime → lifecycle → API + dispatcher.
 * SIGTERM: stop taking work (the listener stays open and answers 503 while draining), let running jobs
 * finish within `shutdown_grace_seconds`, return the rest to the queue, close the listener, exit.
 */
import { randomUUID } from 'node:crypto';
import { isIPv4 } from 'node:net';
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { serve, type ServerType } from '@hono/node-server';
import { createApp } from './api/app.ts';
import { drainAndClose } from './drain.ts';
import { TokenSet } from './api/middleware/auth.ts';
import { ConfigError, loadConfig, type Config } from './config.ts';
import { systemClock, type Clock } from './clock.ts';
import { CompletionWaiter, EventFeed, Executions } from './executions/index.ts';
import { SessionManager } from './sessions/manager.ts';
import { History } from './executions/history.ts';
import { JobTypeBuilds } from './jobtypes/builds.ts';
import { createJobTypeRegistry } from './jobtypes/index.ts';
import type { JobTypeRegistry } from './jobtypes/job-type.ts';
import { createLogger, type Logger } from './logger.ts';
import { Metrics } from './metrics.ts';
import { QUEUED_CHANNEL } from './queue/channels.ts';
import { Dispatcher, dispatchGate } from './queue/dispatcher.ts';
import { Slots } from './queue/slots.ts';
import type { Every } from './queue/holders.ts';
import { CircuitBreaker } from './resilience/breaker.ts';
import { RunGuard } from './resilience/guard.ts';
import { createRuntime } from './runtime/index.ts';
import type { Runtime } from './runtime/runtime.ts';
import { createDb, DatabaseConnectError, type Db } from './store/database.ts';
import { startTracing } from './tracing/setup.ts';
import { liveIds } from './store/executions.repository.ts';
import { liveSessionIds } from './store/sessions.repository.ts';
import { migrateToLatest } from './store/migrate.ts';
import { createWebhooks, type WebhookDelivery } from './webhooks/index.ts';
import type { WebhookDeliveryOptions } from './webhooks/deliver.ts';

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
  /** Starts the run holder's heartbeat and sweep timers (tests stall a process by pausing them). */
  holderTimers?: Every;
  /** This process's `claimed_by` identity (default `host/pid/nonce`; tests run two "replicas" in one process). */
  workerId?: string;
  pollMs?: number;
  /** Webhook delivery: name resolution, jitter, TLS trust, poll period (tests). */
  webhooks?: Pick<WebhookDeliveryOptions, 'lookup' | 'random' | 'tls' | 'pollMs' | 'clock'>;
}

/** A wired service, not yet listening. */
export interface Service {
  config: Config;
  app: ReturnType<typeof createApp>;
  db: Db;
  executions: Executions;
  runtime: Runtime;
  /** Sessions (issue 19), where the runtime has them. */
  sessions?: SessionManager;
  breaker: CircuitBreaker;
  dispatcher: Dispatcher<unknown>;
  /** Run events (`GET /jobs/{id}/events`). */
  events: EventFeed;
  metrics: Metrics;
  logger: Logger;
  /** The webhook delivery worker; null when callbacks are off. */
  webhooks: WebhookDelivery | null;
  /** Starts the runtime, settles orphans, starts the dispatcher. */
  start(): Promise<void>;
  /**
   * Graceful stop: refuse new work, drain within the grace (async and sync runs alike), requeue the
   * rest, close everything. `onDrained` runs once no run is in flight, before the database closes
   * (where the HTTP listener stops accepting: see `drain.ts`).
   */
  stop(graceMs?: number, onDrained?: () => void): Promise<void>;
  /**
   * The step of `stop()` under way (`drain`, `runtime`, `database`, …): a stop that does not return
   * says where it waits. Null before `stop()` and once it returned; a step that threw stays named.
   * A step still running after {@link SLOW_STOP_STEP_MS} is also logged (warn), once.
   */
  stopStep(): string | null;
}

/** How long one step of a service stop may take before it is logged as slow. */
export const SLOW_STOP_STEP_MS = 10_000;

/** Wires the service from a configuration. */
export async function createService(config: Config, o: ServiceOverrides = {}): Promise<Service> {
  const logger = o.logger ?? createLogger(config.log_level, config.log_format);
  const clock: Clock = o.now ? { now: o.now } : systemClock;
  // Before anything else: a tokens file that cannot be read must stop the start, not open the API.
  const tokens = new TokenSet({ tokens: config.auth.tokens, tokensFile: config.auth.tokens_file }, clock, logger);
  const db = o.db ?? (await createDb({ url: config.database_url, workspace: config.workspace, poolSize: config.max_workers + 10, preparedStatements: config.database_prepared_statements }));
  await migrateToLatest(db.kysely);
  const metrics = new Metrics({ defaultMetrics: true });
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
  const baseRegistry: JobTypeRegistry = o.registry ?? (await createJobTypeRegistry(config, { logger }));
  const hooks = { liveExecutionIds: (ids: string[]) => liveIds(db.kysely, ids), liveSessionIds: (ids: string[]) => liveSessionIds(db.kysely, ids) };
  let realRuntime: Runtime | null = null;
  // The warm pool follows the job types as runs see them (with their builds), known once `builds` exists.
  let currentTypes: JobTypeRegistry = baseRegistry;
  const real = async () => (realRuntime = await createRuntime(config, { logger, hooks, jobTypes: () => currentTypes.list() }));
  const runtime = typeof o.runtime === 'function' ? await o.runtime(real) : (o.runtime ?? (await real()));
  // Job types as runs see them: the configured ones with their current builds (SPEC §4.9).
  const builds = new JobTypeBuilds({
    db,
    base: baseRegistry,
    builder: runtime.builder ?? (realRuntime as Runtime | null)?.builder ?? null,
    clock,
    logger,
    owner: `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`,
    timeoutMs: config.builds.timeout_seconds * 1000,
    leaseMs: config.builds.lease_seconds * 1000,
  });
  const registry: JobTypeRegistry = builds;
  currentTypes = registry;
  metrics.watchWarmPool(() => runtime.warmPoolStats?.() ?? []);
  metrics.watchSessionPool(() => runtime.sessionPoolStats?.() ?? []);
  metrics.watchLeadership(() => runtime.leadership?.() ?? null);
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
    ...(o.holderTimers ? { holderTimers: o.holderTimers } : {}),
    ...(o.workerId ? { workerId: o.workerId } : {}),
    events: { onStarted: (r) => metrics.started(r), onFinished: (r) => metrics.finished(r), onRequeued: (_r, reason) => metrics.requeues.inc({ reason }) },
  });
  const webhooks = createWebhooks(config, { db, logger, clock, onAttempt: (outcome) => metrics.webhookDeliveries.inc({ outcome }), ...o.webhooks });
  const waiter = new CompletionWaiter(db);
  const events = new EventFeed(db);
  const dispatcher = new Dispatcher({
    target: executions,
    slots,
    logger,
    subscribe: (wake) => db.listen(QUEUED_CHANNEL, wake),
    // While the breaker is open, queued work stays queued; half-open, one job at a time tests the engine.
    gate: () => dispatchGate(breaker.state, breaker.retryInMs()),
    ...(o.pollMs ? { pollMs: o.pollMs } : {}),
  });
  let shuttingDown = false;
  let stopping: string | null = null;
  const sessions = runtime.openSession ? new SessionManager({ db, runtime, registry, config, executions, clock, logger }) : undefined;
  const app = createApp({ config, history: new History(db), executions, waiter, events, registry, builds, runtime, breaker, slots, logger, metrics, version: VERSION, isShuttingDown: () => shuttingDown, tokens, ...(sessions ? { sessions } : {}) });

  return {
    config,
    app,
    db,
    executions,
    runtime,
    breaker,
    dispatcher: dispatcher as Dispatcher<unknown>,
    events,
    metrics,
    logger,
    webhooks,
    ...(sessions ? { sessions } : {}),
    async start() {
      // The job types first: a runtime's pools size themselves from them as soon as it starts, and
      // before the first list a registry answers only the built-in `default` (a pool would start
      // sandboxes of a type the cluster does not have, to replace them a moment later).
      await registry.start?.();
      await runtime.start();
      await executions.start();
      await waiter.start();
      await events.start();
      const adopted = await executions.recoverOrphans();
      if (adopted.length > 0) logger.warn({ count: adopted.length }, 'settling runs left by a previous process');
      if (config.dispatch) await dispatcher.start();
      await sessions?.start();
      if (config.webhooks.deliver) await webhooks?.start();
    },
    async stop(graceMs = config.shutdown_grace_seconds * 1000, onDrained?: () => void) {
      shuttingDown = true;
      executions.beginDrain();
      const step = async <T>(name: string, fn: () => Promise<T> | T): Promise<T> => {
        stopping = name;
        const slow = setTimeout(() => logger.warn({ step: name, after_ms: SLOW_STOP_STEP_MS }, 'shutdown: a step is still running'), SLOW_STOP_STEP_MS);
        slow.unref();
        try {
          return await fn();
        } finally {
          clearTimeout(slow);
        }
      };
      // Cluster-wide duties (the leader Lease) move to another replica now, not after the drain.
      await step('step-down', () => runtime.stepDown?.());
      const deadline = clock.now() + graceMs;
      const finished = await step('drain', async () => (await dispatcher.stop(graceMs)) && (await executions.syncSettled(deadline - clock.now())));
      if (!finished) {
        logger.warn('grace period over; returning unfinished jobs to the queue');
        executions.abortAll();
        await step('requeue', async () => {
          await dispatcher.drained();
          await executions.syncSettled(5000);
        });
      }
      onDrained?.();
      // Local sandboxes die with the service: its sessions end `service_restart`; a cluster's session
      // pods live on, released for the next process to adopt (docs/api.md).
      await step('sessions', () => sessions?.stop());
      await step('webhooks', () => webhooks?.stop());
      await step('executions', () => executions.stop());
      await step('waiter', () => waiter.stop());
      await step('events', () => events.stop());
      await step('registry', () => registry.stop?.());
      await step('runtime', () => runtime.stop());
      await step('database', () => db.destroy());
      stopping = null;
    },
    stopStep: () => stopping,
  };
}

/** A start-up the configuration forbids; said in one line. */
class StartRefused extends Error {}

/** Whether a host name or address is a loopback one (127.0.0.0/8, ::1, localhost). */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost' || h === '::1' || h === '::ffff:127.0.0.1') return true;
  return isIPv4(h) && h.startsWith('127.');
}

/**
 * Why the service must not listen on `host` with this engine, or null: the `process` engine isolates
 * nothing, so whoever reaches the port runs code as the service's user; it only listens on loopback.
 */
export function unisolatedExposure(engine: string, host: string): string | null {
  if (engine !== 'process' || isLoopbackHost(host)) return null;
  return `the process engine gives no isolation, so it only listens on a loopback address; host is ${host} (set host/SVC_HOST to 127.0.0.1, or use bubblewrap or gVisor)`;
}

/** Starts the HTTP server for a service. */
export function listen(service: Service, port = service.config.port, host = service.config.host): Promise<ServerType> {
  return new Promise((resolve) => {
    // Unread request bodies are discarded by the app itself, with longer bounds (api/middleware/body-rules.ts).
    const server = serve({ fetch: service.app.fetch, port, hostname: host, autoCleanupIncoming: false }, () => resolve(server));
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
  const logger = createLogger(config.log_level, config.log_format);
  // Off unless OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set (tracing/setup.ts).
  const tracing = await startTracing({ version: VERSION });
  const service = await createService(config, { logger });
  await service.start();
  const refusal = unisolatedExposure((await service.runtime.health()).engine, config.host);
  if (refusal) {
    await service.stop(0);
    throw new StartRefused(refusal);
  }
  const server = await listen(service);
  // The handlers go in before the line that says the service listens: a supervisor may signal as soon
  // as it reads that line, and a signal with no handler yet kills the process without its shutdown
  // (the runs tmpfs would stay mounted).
  let stopping = false;
  const shutdown = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'shutting down: no new work (503 while draining); waiting for running jobs');
    await drainAndClose(service, server);
    await tracing.shutdown();
    logger.info('bye');
    process.exit(0);
  };
  process.on('SIGTERM', () => void shutdown('SIGTERM'));
  process.on('SIGINT', () => void shutdown('SIGINT'));
  // SIGUSR2: this replica is about to stop (the chart's preStop hook sends it before its sleep, so
  // SIGTERM comes seconds later): it gives up the leader Lease now and no longer competes for it,
  // and goes on serving until SIGTERM.
  process.on('SIGUSR2', () => {
    logger.info('SIGUSR2: stepping down from the cluster-wide loops (leader Lease released); still serving until SIGTERM');
    void service.runtime.stepDown?.();
  });
  const health = await service.runtime.health();
  logger.info({ host: config.host, port: config.port, auth: config.auth.tokens.length > 0 || config.auth.tokens_file !== null, database: service.db.kind, runtime: config.runtime, engine: health.engine, isolated: health.isolated, version: VERSION }, 'sandpod listening');
  if (!health.isolated) logger.warn('the process engine gives NO isolation: use it for development only');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((err: unknown) => {
    // An expected start-up failure is one line that says what failed; anything else keeps its stack.
    if (err instanceof ConfigError) {
      process.stderr.write(`sandpod: ${err.message}\n`);
      process.exit(2);
    }
    if (err instanceof DatabaseConnectError || err instanceof StartRefused) {
      process.stderr.write(`sandpod: failed to start: ${err.message}\n`);
      process.exit(1);
    }
    process.stderr.write(`sandpod: failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
}
