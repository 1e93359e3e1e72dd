/**
 * The delivery worker: claims due deliveries from the outbox (outbox.ts), signs them (sign.ts), checks
 * and dials their destination (ssrf.ts, send.ts), and records each attempt with what follows it, a
 * pure decision (decide.ts). Several replicas may run it: claims skip locked rows and hold a lease.
 * A delivery is sent at least once: a worker killed mid-send leaves a lease that runs out, and another
 * worker (or this one, restarted) sends it again with the same `webhook-id`.
 */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type https from 'node:https';
import { SpanKind, SpanStatusCode, type Span } from '@opentelemetry/api';
import { systemClock, type Clock } from '../clock.ts';
import { errorMessage } from '../errors.ts';
import { recordView } from '../executions/views.ts';
import type { Logger } from '../logger.ts';
import type { Db, ExecutionRow } from '../store/database.ts';
import { getExecution } from '../store/executions.repository.ts';
import { SPAN } from '../tracing/run-spans.ts';
import { contextOf, isTracing, startSpan, traceparentOf } from '../tracing/spans.ts';
import { stringifyJson } from '../util/json.ts';
import type { WebhooksConfig } from './config.ts';
import { decideAfterAttempt, describeResult, type AttemptResult } from './decide.ts';
import { claimDue, nextDueAt, recordAttempt, WEBHOOKS_CHANNEL, type ClaimedDelivery } from './outbox.ts';
import { send } from './send.ts';
import type { Signer } from './sign.ts';
import { defaultLookup, resolveTarget, type Lookup } from './ssrf.ts';

/** What an attempt ended as (the `outcome` label of `sandpod_webhook_deliveries_total`). */
export type DeliveryOutcome = 'delivered' | 'retried' | 'failed';

/** Options of {@link WebhookDelivery}. */
export interface WebhookDeliveryOptions {
  db: Db;
  config: WebhooksConfig;
  signer: Signer;
  logger: Logger;
  clock?: Clock;
  workerId?: string;
  /** Name resolution (tests point names at addresses without touching /etc/hosts). */
  lookup?: Lookup;
  /** The jitter's source, in [0, 1). */
  random?: () => number;
  /** Called once per recorded attempt. */
  onAttempt?: (outcome: DeliveryOutcome) => void;
  /** Longest sleep between two looks at the outbox when nothing wakes the worker (default 5 s). */
  pollMs?: number;
  /** TLS options of every attempt (tests trust their own CA). */
  tls?: https.RequestOptions;
}

/** The body POSTed for a record: a Standard Webhooks payload with the SPEC §2.3 record as `data`. */
export function payloadOf(row: ExecutionRow): string {
  const at = row.ended_at ?? row.created_at;
  return stringifyJson({ type: 'execution.finished', timestamp: new Date(at).toISOString(), data: recordView(row, false) });
}

/** Sends the outbox's deliveries; see the module comment. */
export class WebhookDelivery {
  readonly workerId: string;
  private readonly clock: Clock;
  private running = false;
  private loop: Promise<void> | null = null;
  private wake: (() => void) | null = null;
  private unlisten: (() => Promise<void>) | null = null;

  constructor(private readonly o: WebhookDeliveryOptions) {
    this.clock = o.clock ?? systemClock;
    this.workerId = o.workerId ?? `${hostname()}/${process.pid}/${randomBytes(4).toString('hex')}`;
  }

  /** Starts the loop: woken by the outbox trigger's NOTIFY, and at least every `pollMs`. */
  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    this.unlisten = await this.o.db.listen(WEBHOOKS_CHANNEL, () => this.wake?.());
    this.loop = this.run();
  }

  /** Stops taking deliveries and waits for the attempts in flight (each bounded by its timeout). */
  async stop(): Promise<void> {
    this.running = false;
    this.wake?.();
    await this.loop;
    this.loop = null;
    await this.unlisten?.().catch(() => {});
    this.unlisten = null;
  }

  private async run(): Promise<void> {
    const pollMs = this.o.pollMs ?? 5000;
    while (this.running) {
      let sent = 0;
      let sleepMs = pollMs;
      try {
        sent = await this.runOnce();
        if (sent === 0) {
          const due = await nextDueAt(this.o.db.kysely);
          if (due) sleepMs = Math.max(10, Math.min(pollMs, due.getTime() - this.clock.now()));
        }
      } catch (err) {
        this.o.logger.warn({ err: errorMessage(err) }, 'webhook delivery pass failed; trying again shortly');
      }
      if (sent > 0 || !this.running) continue;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, sleepMs);
        this.wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.wake = null;
    }
  }

  /** Claims the deliveries due now (by the injected clock) and attempts each once; returns how many. */
  async runOnce(): Promise<number> {
    const c = this.o.config;
    const now = this.clock.now();
    // Longer than an attempt can take (its deadline, plus recording it); a dead worker's deliveries wait this long.
    const leaseMs = c.timeout_seconds * 2000 + 5000;
    const claimed = await claimDue(this.o.db.kysely, this.workerId, new Date(now), new Date(now + leaseMs), c.concurrency);
    await Promise.all(claimed.map((d) => this.attempt(d)));
    return claimed.length;
  }

  private async attempt(d: ClaimedDelivery): Promise<void> {
    const c = this.o.config;
    const attempt = d.attempts + 1;
    const started = this.clock.now();
    const log = this.o.logger.child({ execution_id: d.execution_id, webhook_id: d.id, attempt });
    let result: AttemptResult;
    // One span per attempt, in the run's trace (its stored traceparent); the receiver gets it as `traceparent`.
    let span: Span | null = null;
    try {
      const row = await getExecution(this.o.db.kysely, d.execution_id);
      if (!row) throw new Error('its record is gone');
      if (isTracing()) {
        span = startSpan(SPAN.webhook, {
          parent: contextOf(row.traceparent),
          startTime: started,
          kind: SpanKind.CLIENT,
          attributes: { 'sandpod.execution_id': d.execution_id, 'sandpod.webhook.id': d.id, 'sandpod.webhook.attempt': attempt, 'server.address': new URL(d.url).hostname },
        });
      }
      const body = payloadOf(row);
      const target = await resolveTarget(d.url, c, this.o.lookup ?? defaultLookup);
      if ('refused' in target) result = { kind: 'refused', message: target.refused };
      else {
        const headers: Record<string, string> = { ...this.o.signer.headers(d.id, new Date(started), body), ...(span ? { traceparent: traceparentOf(span) } : {}) };
        result = await send(target, { headers, body, timeoutMs: c.timeout_seconds * 1000, maxResponseBytes: c.max_response_bytes, ...(this.o.tls ? { tls: this.o.tls } : {}) });
      }
    } catch (err) {
      result = { kind: 'error', message: errorMessage(err) };
    }
    const now = this.clock.now();
    const decision = decideAfterAttempt({
      result,
      attempt,
      firstAttemptAt: d.first_attempt_at?.getTime() ?? started,
      now,
      policy: { maxAttempts: c.max_attempts, maxAgeMs: c.max_age_seconds * 1000, baseDelayMs: c.base_delay_seconds * 1000 },
      random: (this.o.random ?? Math.random)(),
    });
    if (span) {
      span.setAttribute('sandpod.webhook.outcome', decision.outcome);
      if (result.kind === 'answered') span.setAttribute('http.response.status_code', result.statusCode);
      if (decision.outcome !== 'delivered') span.setStatus({ code: SpanStatusCode.ERROR, message: describeResult(result) });
      span.end(Math.max(now, started));
    }
    const record = {
      attempt,
      startedAt: new Date(started),
      durationMs: Math.max(0, Math.round(now - started)),
      statusCode: result.kind === 'answered' ? result.statusCode : null,
      error: result.kind === 'answered' && decision.outcome === 'delivered' ? null : describeResult(result),
    };
    try {
      const mine = await recordAttempt(this.o.db.kysely, d, this.workerId, record, decision, new Date(now));
      if (!mine) {
        log.warn('delivery was taken over by another worker (lease ran out); attempt not recorded');
        return;
      }
    } catch (err) {
      // The lease runs out and the delivery is attempted again: at least once.
      log.warn({ err: errorMessage(err) }, 'could not record a webhook attempt; it will be retried');
      return;
    }
    this.o.onAttempt?.(decision.outcome);
    if (decision.outcome === 'delivered') log.info({ status_code: record.statusCode }, 'webhook delivered');
    else if (decision.outcome === 'retried') log.info({ result: record.error, next_attempt_at: new Date(decision.nextAttemptAt).toISOString() }, 'webhook attempt failed; will retry');
    else log.warn({ reason: decision.reason }, 'webhook delivery failed for good; put in the DLQ as webhook_failed');
  }
}
