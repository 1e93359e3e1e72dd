/**
 * The cluster's egress proxy: one TCP listener for every run pod of a release. Each request carries its
 * run's credential (token.ts); the proxy applies that run's `allowed_hosts` and logs every decision
 * with the execution id (refusals at `warn`).
 */
import { systemClock, type Clock } from '../clock.ts';
import type { Logger } from '../logger.ts';
import { EgressProxy, type Dial, type Lookup } from './proxy.ts';
import { authenticateProxyRequest } from './token.ts';

export interface ClusterEgressOptions {
  /** HMAC key shared with the service (the chart's egress Secret). */
  key: Buffer | string;
  port: number;
  host: string;
  logger: Logger;
  clock?: Clock;
  lookup?: Lookup;
  dial?: Dial;
  connectTimeoutMs?: number;
  /** Time to receive a request head (default 10 s). */
  headTimeoutMs?: number;
  /** Tunnel and forwarded-request idle timeout (default 5 min). */
  idleTimeoutMs?: number;
  /** Connections past their head, all runs (default 1024). */
  maxConnections?: number;
  /** Connections past their head of one run (default 64). */
  maxConnectionsPerRun?: number;
  /** Connections still sending a head, all sources (default: maxConnections). */
  maxPendingConnections?: number;
  /** Connections still sending a head from one source address, i.e. one run pod (default 64). */
  maxPendingPerSource?: number;
}

/** Starts the shared proxy; `close()` it to stop. */
export async function startClusterEgressProxy(o: ClusterEgressOptions): Promise<EgressProxy> {
  const clock = o.clock ?? systemClock;
  return EgressProxy.listenTcp(o.port, o.host, {
    authenticate: (header) => {
      const r = authenticateProxyRequest(header, o.key, clock.now());
      return 'refused' in r ? r : { executionId: r.grant.executionId, allowedHosts: r.grant.allowedHosts };
    },
    onDecision: (d) => {
      const fields = { ...(d.executionId !== undefined ? { execution_id: d.executionId } : {}), host: d.host, port: d.port, allowed: d.allowed, ...(d.reason ? { reason: d.reason } : {}) };
      if (d.allowed) o.logger.info(fields, 'egress allowed');
      else o.logger.warn(fields, 'egress refused');
    },
    ...(o.lookup ? { lookup: o.lookup } : {}),
    ...(o.dial ? { dial: o.dial } : {}),
    ...(o.connectTimeoutMs !== undefined ? { connectTimeoutMs: o.connectTimeoutMs } : {}),
    ...(o.headTimeoutMs !== undefined ? { headTimeoutMs: o.headTimeoutMs } : {}),
    ...(o.idleTimeoutMs !== undefined ? { idleTimeoutMs: o.idleTimeoutMs } : {}),
    ...(o.maxPendingConnections !== undefined ? { maxPendingConnections: o.maxPendingConnections } : {}),
    maxConnections: o.maxConnections ?? 1024,
    maxConnectionsPerRun: o.maxConnectionsPerRun ?? 64,
    maxPendingPerSource: o.maxPendingPerSource ?? 64,
  });
}
