/** What the HTTP layer is given by `main.ts` (or a test): everything it talks to. */
import type { TokenSet } from './middleware/auth.ts';
import type { Config } from '../config.ts';
import type { History } from '../executions/history.ts';
import type { CompletionWaiter, EventFeed, Executions } from '../executions/index.ts';
import type { JobTypeBuilds } from '../jobtypes/builds.ts';
import type { JobTypeRegistry } from '../jobtypes/job-type.ts';
import type { Logger } from '../logger.ts';
import type { Metrics } from '../metrics.ts';
import type { Slots } from '../queue/slots.ts';
import type { CircuitBreaker } from '../resilience/breaker.ts';
import type { Runtime } from '../runtime/runtime.ts';
import type { SessionManager } from '../sessions/manager.ts';

/** Dependencies of the API. */
export interface AppDeps {
  config: Config;
  /** Every read of records, artifacts, the queue and the DLQ (the API holds no SQL). */
  history: History;
  executions: Executions;
  waiter: CompletionWaiter;
  /** Run events for `GET /jobs/{id}/events`; absent → 501. */
  events?: EventFeed;
  registry: JobTypeRegistry;
  /** Job-type builds (`POST /job-types/{name}/build`); absent → 501. */
  builds?: JobTypeBuilds;
  runtime: Runtime;
  breaker: CircuitBreaker;
  slots: Slots;
  logger: Logger;
  metrics: Metrics;
  version: string;
  /** API bearer tokens; absent or not enabled: no authentication. */
  tokens?: TokenSet;
  /** Sessions (issue 19); absent → 501. */
  sessions?: SessionManager;
  /** True once SIGTERM arrived: new work is refused with 503. */
  isShuttingDown?: () => boolean;
}

/** Hono environment: per-request variables set by middleware. */
export interface AppEnv {
  Variables: {
    correlationId: string;
    logger: Logger;
    /**
     * Who the request is trusted as: a token's short name (auth on, a valid token), `local` (auth off,
     * an allowed Host), absent otherwise. Gates `/health`'s details and keys the event-stream caps.
     */
    principal?: string;
    /** The W3C traceparent a submission's run continues (api/middleware/tracing.ts); absent without a trace. */
    traceparent?: string;
  };
}
