/**
 * Prometheus metrics (`GET /metrics`): runs by status and job type, run duration and queue wait
 * histograms, queue depth, worker slots, breaker state, HTTP requests by route template, and the
 * standard process and Node.js metrics. One registry per service instance, so tests can build
 * several apps in one process. The exposition passes `promtool check metrics` (tested).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { LeadershipStatus, WarmPoolStats } from './runtime/runtime.ts';
import type { SessionPoolStats } from './runtime/session.ts';
import type { ExecutionRow } from './store/database.ts';

/** prom-client default gauges that repeat `sum(<name without _total>)` under a counter's suffix. */
const SUM_GAUGES = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];

/** The API tokens' state, read at scrape time. */
export interface AuthStats {
  fileErrors: number;
  failed: boolean;
}

/** The service's metrics. */
export class Metrics {
  readonly registry = new Registry();
  readonly runs: Counter<'status' | 'job_type' | 'mode' | 'error_type'>;
  readonly runDuration: Histogram<'job_type' | 'status'>;
  readonly queueWait: Histogram<'job_type'>;
  readonly queueDepth: Gauge<'state'>;
  readonly slotsBusy: Gauge;
  readonly breakerState: Gauge;
  readonly submissions: Counter<'mode' | 'outcome'>;
  /** Jobs given back to the queue, by why (issue 22 item 4: a fault does not fail queued work). */
  readonly requeues: Counter<'reason'>;
  readonly httpRequests: Counter<'method' | 'route' | 'status'>;
  readonly httpDuration: Histogram<'method' | 'route'>;
  readonly eventStreams: Gauge;
  /** DLQ entries (all processes) and the configured max_queue_size: set at scrape, for the chart's alerts. */
  readonly dlqEntries: Gauge;
  readonly queueMaxSize: Gauge;
  readonly eventStreamsRefused: Counter<'reason'>;
  /** Webhook attempts by what followed them (issue 21; the chart alerts on `failed`). */
  readonly webhookDeliveries: Counter<'outcome'>;
  private warmSource: () => WarmPoolStats[] = () => [];
  private sessionPoolSource: () => SessionPoolStats[] = () => [];
  private leaderSource: () => LeadershipStatus | null = () => null;
  private authSource: () => AuthStats | null = () => null;

  constructor(opts: { defaultMetrics?: boolean } = {}) {
    const registers = [this.registry];
    this.runs = new Counter({ name: 'sandpod_runs_total', help: 'Finished runs by status and job type', labelNames: ['status', 'job_type', 'mode', 'error_type'], registers });
    this.runDuration = new Histogram({
      name: 'sandpod_run_duration_seconds',
      help: 'Run duration from start to end',
      labelNames: ['job_type', 'status'],
      buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
      registers,
    });
    this.queueWait = new Histogram({
      name: 'sandpod_queue_wait_seconds',
      help: 'Time a job waited in the queue before a worker took it',
      labelNames: ['job_type'],
      buckets: [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300],
      registers,
    });
    this.queueDepth = new Gauge({ name: 'sandpod_queue_depth', help: 'Jobs queued or running (all processes)', labelNames: ['state'], registers });
    this.slotsBusy = new Gauge({ name: 'sandpod_worker_slots_busy', help: 'Worker slots in use in this process', registers });
    this.breakerState = new Gauge({ name: 'sandpod_circuit_breaker_state', help: 'Circuit breaker: 0 closed, 1 half_open, 2 open', registers });
    this.submissions = new Counter({ name: 'sandpod_submissions_total', help: 'Accepted submissions', labelNames: ['mode', 'outcome'], registers });
    this.requeues = new Counter({
      name: 'sandpod_requeues_total',
      help: 'Jobs given back to the queue: breaker_open, infra_failure (before user code started), shutdown, crash',
      labelNames: ['reason'],
      registers,
    });
    // `route` is a route template (`/jobs/:id`) or UNMATCHED_ROUTE, never a raw path: see
    // api/middleware/http-metrics.ts. Buckets reach 300 s because sync runs and long-polls are long.
    this.httpRequests = new Counter({
      name: 'sandpod_http_requests_total',
      help: 'HTTP requests answered, by method, route template and status code',
      labelNames: ['method', 'route', 'status'],
      registers,
    });
    this.httpDuration = new Histogram({
      name: 'sandpod_http_request_duration_seconds',
      help: 'Time from receiving a request to its response headers, by method and route template',
      labelNames: ['method', 'route'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
      registers,
    });
    this.dlqEntries = new Gauge({ name: 'sandpod_dlq_entries', help: 'Entries in the dead letter queue (all processes)', registers });
    this.queueMaxSize = new Gauge({ name: 'sandpod_queue_max_size', help: 'max_queue_size: jobs queued or running beyond which submissions are refused', registers });
    this.eventStreams = new Gauge({ name: 'sandpod_event_streams_open', help: 'Event streams (GET /jobs/{id}/events) open in this process', registers });
    this.eventStreamsRefused = new Counter({
      name: 'sandpod_event_streams_refused_total',
      help: 'Event streams refused with 429, by the cap reached: total (http.max_event_streams) or per_token',
      labelNames: ['reason'],
      registers,
    });
    this.webhookDeliveries = new Counter({
      name: 'sandpod_webhook_deliveries_total',
      help: 'Webhook delivery attempts: delivered (2xx), retried (another attempt follows), failed (given up, put in the DLQ)',
      labelNames: ['outcome'],
      registers,
    });
    // Every outcome from zero, so rate() and alerts see the series before the first failure.
    for (const outcome of ['delivered', 'retried', 'failed']) this.webhookDeliveries.inc({ outcome }, 0);
    // Warm sandboxes (issue 10), read from the runtime at scrape time.
    const warm = () => this.warmSource();
    new Gauge({
      name: 'sandpod_warm_sandboxes',
      help: 'Warm sandboxes per job type: ready (waiting for a run) or starting',
      labelNames: ['job_type', 'state'],
      registers,
      collect() {
        this.reset();
        for (const s of warm()) {
          this.set({ job_type: s.job_type, state: 'ready' }, s.ready);
          this.set({ job_type: s.job_type, state: 'starting' }, s.starting);
        }
      },
    });
    new Gauge({
      name: 'sandpod_warm_sandboxes_target',
      help: 'Wanted warm sandboxes per job type (warm_pool.sizes, or following demand with warm_pool.autoscale)',
      labelNames: ['job_type'],
      registers,
      collect() {
        this.reset();
        for (const s of warm()) this.set({ job_type: s.job_type }, s.target);
      },
    });
    new Gauge({
      name: 'sandpod_warm_sandbox_oldest_age_seconds',
      help: 'Age of the oldest ready warm sandbox per job type (absent when none is ready)',
      labelNames: ['job_type'],
      registers,
      collect() {
        this.reset();
        for (const s of warm()) if (s.oldest_age_ms !== null) this.set({ job_type: s.job_type }, s.oldest_age_ms / 1000);
      },
    });
    new Gauge({
      name: 'sandpod_warm_refill_seconds',
      help: 'Mean time from a warm sandbox start to its readiness per job type (absent before one was measured)',
      labelNames: ['job_type'],
      registers,
      collect() {
        this.reset();
        for (const s of warm()) if (s.refill_ms !== undefined && s.refill_ms !== null) this.set({ job_type: s.job_type }, s.refill_ms / 1000);
      },
    });
    new Counter({
      name: 'sandpod_warm_claims_total',
      help: 'Runs of a pooled job type by whether a warm sandbox was ready (hit) or the run started cold (miss)',
      labelNames: ['job_type', 'outcome'],
      registers,
      collect() {
        this.reset();
        for (const s of warm()) {
          this.inc({ job_type: s.job_type, outcome: 'hit' }, s.hits);
          this.inc({ job_type: s.job_type, outcome: 'miss' }, s.misses);
        }
      },
    });
    new Counter({
      name: 'sandpod_warm_restored_total',
      help: 'Warm sandboxes restored from a checkpoint instead of booted, per job type (local gVisor with warm_pool.restore)',
      labelNames: ['job_type'],
      registers,
      collect() {
        this.reset();
        for (const s of warm()) if (s.restored !== undefined) this.inc({ job_type: s.job_type }, s.restored);
      },
    });
    // Ready session sandboxes (issue 19), read from the runtime at scrape time.
    const sessionPool = () => this.sessionPoolSource();
    new Gauge({
      name: 'sandpod_session_pool_sandboxes',
      help: 'Session sandboxes kept ahead per job type: ready (waiting for a session) or starting',
      labelNames: ['job_type', 'state'],
      registers,
      collect() {
        this.reset();
        for (const s of sessionPool()) {
          this.set({ job_type: s.job_type, state: 'ready' }, s.ready);
          this.set({ job_type: s.job_type, state: 'starting' }, s.starting);
        }
      },
    });
    new Gauge({
      name: 'sandpod_session_pool_target',
      help: 'Wanted ready session sandboxes per job type (warm_pool.session_sizes, at least 1 while sessions of the type are opened)',
      labelNames: ['job_type'],
      registers,
      collect() {
        this.reset();
        for (const s of sessionPool()) this.set({ job_type: s.job_type }, s.target);
      },
    });
    new Counter({
      name: 'sandpod_session_pool_claims_total',
      help: 'Sessions without extra requirements by whether a ready session sandbox was there (hit) or the session started its own (miss)',
      labelNames: ['job_type', 'outcome'],
      registers,
      collect() {
        this.reset();
        for (const s of sessionPool()) {
          this.inc({ job_type: s.job_type, outcome: 'hit' }, s.hits);
          this.inc({ job_type: s.job_type, outcome: 'miss' }, s.misses);
        }
      },
    });
    // API tokens (issue 22): a tokens file whose change left it unusable refuses every request.
    const auth = () => this.authSource();
    new Counter({
      name: 'sandpod_auth_tokens_file_errors_total',
      help: 'Changes of the API tokens file that left it unusable (missing, unreadable, invalid or empty): every request is refused until it is fixed',
      registers,
      collect() {
        this.reset();
        this.inc(auth()?.fileErrors ?? 0);
      },
    });
    new Gauge({
      name: 'sandpod_auth_tokens_file_failed',
      help: '1 while the API tokens file is unusable and no token is accepted, else 0',
      registers,
      collect() {
        this.set(auth()?.failed ? 1 : 0);
      },
    });
    new Counter({
      name: 'sandpod_warm_handover_retries_total',
      help: 'Hand-overs to a claimed warm sandbox that failed before the program started; each run was tried again (another warm sandbox, or cold)',
      labelNames: ['job_type'],
      registers,
      collect() {
        this.reset();
        for (const s of warm()) if (s.handover_retries !== undefined) this.inc({ job_type: s.job_type }, s.handover_retries);
      },
    });
    // Leader election (issue 20): which replica runs the cluster-wide loops.
    const leader = () => this.leaderSource();
    new Gauge({
      name: 'sandpod_leader',
      help: '1 while this replica holds the leader Lease and runs the cluster-wide loops (pool sizing, orphan sweep), else 0; absent without a cluster runtime',
      labelNames: ['identity'],
      registers,
      collect() {
        this.reset();
        const l = leader();
        if (l) this.set({ identity: l.identity }, l.leading ? 1 : 0);
      },
    });
    if (opts.defaultMetrics) {
      // prom-client's standard names (process_*, nodejs_*), unprefixed, so stock dashboards and
      // alerts find them.
      collectDefaultMetrics({ register: this.registry });
      // Except three gauges named *_total, which Prometheus reserves for counters (promtool rejects
      // them); each is the sum over the labelled gauge of the same name without the suffix.
      for (const name of SUM_GAUGES) this.registry.removeSingleMetric(name);
    }
  }

  /** Where the warm sandbox series come from (the runtime's pools). */
  watchWarmPool(source: () => WarmPoolStats[]): void {
    this.warmSource = source;
  }

  /** Where the session pool series come from (the runtime's ready session sandboxes). */
  watchSessionPool(source: () => SessionPoolStats[]): void {
    this.sessionPoolSource = source;
  }

  /** Where leadership comes from (the Kubernetes runtime). */
  watchLeadership(source: () => LeadershipStatus | null): void {
    this.leaderSource = source;
  }

  /** Where the API tokens' state comes from (api/middleware/auth.ts). */
  watchAuth(source: () => AuthStats | null): void {
    this.authSource = source;
  }

  /** Records a run that started (queue wait for async jobs). */
  started(row: ExecutionRow): void {
    if (row.mode === 'async' && row.started_at) {
      const wait = (new Date(row.started_at).getTime() - new Date(row.created_at).getTime()) / 1000;
      this.queueWait.observe({ job_type: row.job_type }, Math.max(0, wait));
    }
  }

  /** Records a finished run. */
  finished(row: ExecutionRow): void {
    const errorType = (row.error as { type?: string } | null)?.type ?? '';
    this.runs.inc({ status: row.status, job_type: row.job_type, mode: row.mode, error_type: errorType });
    if (row.duration_ms !== null) this.runDuration.observe({ job_type: row.job_type, status: row.status }, row.duration_ms / 1000);
  }
}
