/**
 * The network check (issue 23 item 2): "no network" for `network: none` runs rests on NetworkPolicy,
 * which some CNIs accept and do not enforce (a plain bridge, managed clusters without the policy
 * add-on), and on the optional `--network=none` RuntimeClass. At start the runtime runs one canary pod
 * made as a `network: none` run pod is (the preflight canary's sandbox, plus that network type's
 * labels, resolver and RuntimeClass) that tries to open a TCP connection to the service's own Service
 * (ClusterIP and port, read from the API: it needs no DNS). If it connects, nothing stops a
 * `network: none` program from reaching the API, and `/health` is degraded: "network policy not
 * enforced". The check never blocks start-up or runs.
 *
 * Three parts, like preflight.ts: {@link buildNetworkCheckJob} (pure), {@link networkCheckVerdict}
 * (pure, from the canary pod as the informer sees it and the time) and {@link NetworkCheck} (I/O).
 */
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import { noNetworkDns, runtimeClassForRun, type BuildJobConfig } from '../runs/build-job.ts';
import { IMAGE_ERRORS, START_ERRORS } from '../runs/decide.ts';
import { LABELS } from '../names.ts';
import { buildCanaryJob, PREFLIGHT_LABEL, runCanaryJob, type PreflightDeps } from './preflight.ts';

/** Value of {@link PREFLIGHT_LABEL} on the network canary's Job and pod. */
export const NETWORK_CHECK_ROLE = 'network-check';
const CONTAINER = 'canary';

/**
 * The canary: connect to argv[1]:argv[2], trying again for argv[3] seconds while it fails, and report
 * the first success or the last failure. Neither kind of failure says anything about policy early on:
 * a Service without a ready endpoint (the service's own pods still starting) is refused by kube-proxy,
 * and a Service created with the release may have no rules on the node yet, so its packets go nowhere
 * and the connect times out, as under a policy that drops them (seen on a real cluster). Only a
 * failure that lasts the whole window counts. The report goes to the termination message.
 */
export const NETWORK_CHECK_SCRIPT = `
import errno, json, socket, sys, time
host, port, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + wait
attempts = 0
while True:
    attempts += 1
    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
        res = {'reached': True}
        break
    except OSError as e:
        code = e.errno or 0
        res = {'reached': False, 'refused': code == errno.ECONNREFUSED, 'error': (type(e).__name__ + ': ' + str(e))[:200]}
        if time.monotonic() >= deadline:
            break
        time.sleep(2)
    finally:
        s.close()
res['attempts'] = attempts
doc = json.dumps({'sandpod_network_check': 1, 'target': '%s:%d' % (host, port), 'result': res})
try:
    with open('/dev/termination-log', 'w') as f:
        f.write(doc)
except OSError:
    pass
print(doc)
`.trim();

/** Inputs of {@link buildNetworkCheckJob}. */
export interface NetworkCheckJobOptions {
  name: string;
  /** The class a run would get (null: permissive without gVisor); the network-none class is derived from it. */
  runtimeClassName: string | null;
  target: { host: string; port: number };
  /** How long failed connections (refused or timed out) are tried again, s. */
  retrySec: number;
}

/** The canary Job: a `network: none` run pod's sandbox, network and labels, running the connect. */
export function buildNetworkCheckJob(config: BuildJobConfig, o: NetworkCheckJobOptions): V1Job {
  const job = buildCanaryJob(config, { name: o.name, runtimeClassName: runtimeClassForRun('none', o.runtimeClassName, config) });
  // The labels NetworkPolicy and operators select `network: none` run pods by.
  const labels = { ...job.metadata!.labels!, [PREFLIGHT_LABEL]: NETWORK_CHECK_ROLE, [LABELS.network]: 'none' };
  const tpl = job.spec!.template;
  const container = tpl.spec!.containers[0]!;
  return {
    ...job,
    metadata: { ...job.metadata!, labels: { ...labels } },
    spec: {
      ...job.spec!,
      template: {
        metadata: { labels: { ...labels } },
        spec: {
          ...tpl.spec!,
          ...noNetworkDns(),
          containers: [
            {
              ...container,
              command: ['/usr/bin/env', '-i', 'PATH=/usr/local/bin:/usr/bin:/bin', 'HOME=/tmp', 'python3', '-I', '-c', NETWORK_CHECK_SCRIPT, o.target.host, String(o.target.port), String(o.retrySec)],
            },
          ],
        },
      },
    },
  };
}

/** What the network check found. */
export type NetworkCheckResult =
  | { status: 'running' }
  /** The canary could not connect (the error says how it was stopped). */
  | { status: 'isolated'; target: string; error: string }
  /** The canary connected: `network: none` pods can reach the service. */
  | { status: 'not_isolated'; target: string; reason: string }
  /** The check itself could not tell (see `reason`); also a missing network-none RuntimeClass. */
  | { status: 'inconclusive' | 'failed'; reason: string };

/** The reason `/health` gives when a `network: none` pod reached the service. */
export const NOT_ENFORCED = 'network policy not enforced';

/** The canary's report from its termination message, or null when there is none. */
export function parseNetworkReport(message: string | undefined): { target: string; reached: boolean; refused: boolean; error: string } | null {
  const line = (message ?? '').trim().split('\n').reverse().find((l) => l.startsWith('{"sandpod_network_check"'));
  if (!line) return null;
  try {
    const doc = JSON.parse(line) as { target?: unknown; result?: { reached?: unknown; refused?: unknown; error?: unknown } };
    if (typeof doc.target !== 'string' || !doc.result || typeof doc.result.reached !== 'boolean') return null;
    return { target: doc.target, reached: doc.result.reached, refused: doc.result.refused === true, error: typeof doc.result.error === 'string' ? doc.result.error : '' };
  } catch {
    return null;
  }
}

/**
 * The verdict from the canary pod as last seen (`undefined`: not seen yet), `elapsedMs` since its Job
 * was created and the limit `timeoutMs`. Pure: table-tested.
 */
export function networkCheckVerdict(pod: V1Pod | undefined, elapsedMs: number, timeoutMs: number): NetworkCheckResult {
  const c = pod?.status?.containerStatuses?.find((s) => s.name === CONTAINER);
  const waiting = c?.state?.waiting;
  if (waiting?.reason && IMAGE_ERRORS.has(waiting.reason)) {
    return { status: 'inconclusive', reason: `the network canary's image cannot be used (${waiting.reason})` };
  }
  const term = c?.state?.terminated;
  if (term) {
    if (term.reason && START_ERRORS.has(term.reason)) {
      return { status: 'inconclusive', reason: `the network canary could not start (${term.reason}: ${term.message ?? ''})`.trim() };
    }
    const r = parseNetworkReport(term.message);
    if (!r) return { status: 'inconclusive', reason: `the network canary exited ${term.exitCode} without its report` };
    if (r.reached) {
      return { status: 'not_isolated', target: r.target, reason: `${NOT_ENFORCED}: a network none pod connected to the service's own Service at ${r.target}` };
    }
    // Refused to the end: kube-proxy's answer for a Service with no ready endpoint, not a policy's.
    if (r.refused) return { status: 'inconclusive', reason: `the service's Service at ${r.target} refused every connection (no ready endpoint); isolation unknown` };
    return { status: 'isolated', target: r.target, error: r.error };
  }
  if (elapsedMs >= timeoutMs) {
    const why = waiting?.reason ?? (pod ? (pod.status?.phase ?? 'Pending') : 'no pod was created');
    return { status: 'inconclusive', reason: `the network canary did not finish within ${Math.round(timeoutMs / 1000)} s (${why})` };
  }
  return { status: 'running' };
}

/** What {@link NetworkCheck} uses of the cluster: the preflight's, and the Service and RuntimeClass look-ups. */
export interface NetworkCheckDeps extends PreflightDeps {
  /** The service's Service (`kubernetes.network_check_service`): ClusterIP and port, null if absent. */
  serviceAddress(): Promise<{ host: string; port: number } | null>;
  runtimeClassExists(name: string): Promise<boolean>;
  retrySec?: number;
}

/** One network check per runtime start; {@link result} is what `/health` reports. */
export class NetworkCheck {
  private current: NetworkCheckResult = { status: 'running' };
  private stopped = false;

  constructor(private readonly d: NetworkCheckDeps) {}

  get result(): NetworkCheckResult {
    return this.current;
  }

  stop(): void {
    this.stopped = true;
  }

  /** Runs the canary to a verdict; never throws. */
  async run(): Promise<NetworkCheckResult> {
    const { d } = this;
    const k = d.config.kubernetes;
    const why = (err: unknown) => String(err instanceof Error ? err.message : err);
    const noneClass = runtimeClassForRun('none', d.runtimeClassName, d.config);
    if (noneClass && noneClass !== d.runtimeClassName) {
      // Every network none run would fail to start: say so rather than wait for the canary's timeout.
      const exists = await d.runtimeClassExists(noneClass).catch(() => null);
      if (exists === false) return this.settle({ status: 'failed', reason: `RuntimeClass ${noneClass} (runtime_class_network_none) does not exist: network none runs cannot start` });
    }
    let target: { host: string; port: number } | null;
    try {
      target = await d.serviceAddress();
    } catch (err) {
      return this.settle({ status: 'inconclusive', reason: `cannot read Service ${k.network_check_service}: ${why(err)}` });
    }
    if (!target) return this.settle({ status: 'inconclusive', reason: `Service ${k.network_check_service} not found in ${k.namespace} (or it has no ClusterIP)` });
    const name = `sp-netcheck-${d.clock.now().toString(36)}-${Math.random().toString(36).slice(2, 7)}`;
    const timeoutMs = d.timeoutMs ?? 240_000;
    const job = buildNetworkCheckJob(d.config, { name, runtimeClassName: d.runtimeClassName, target, retrySec: d.retrySec ?? 90 });
    try {
      return this.settle(await runCanaryJob(d, job, (pod, elapsedMs) => networkCheckVerdict(pod, elapsedMs, timeoutMs), () => this.stopped));
    } catch (err) {
      return this.settle({ status: 'inconclusive', reason: `the network canary Job could not be created: ${why(err)}` });
    }
  }

  private settle(r: NetworkCheckResult): NetworkCheckResult {
    this.current = r;
    if (r.status === 'isolated') this.d.log.info({ target: r.target, error: r.error }, 'network check passed: a network none pod cannot reach the service');
    else if (r.status === 'not_isolated') this.d.log.error({ target: r.target }, `${NOT_ENFORCED}: network none runs can reach the service (see SECURITY.md, "Network")`);
    else if (r.status !== 'running') this.d.log.warn({ check: r.status, reason: r.reason }, 'network check could not tell whether network none pods are isolated');
    return r;
  }

  /** The `/health` problem this result stands for, if any. */
  static problem(r: NetworkCheckResult): string | null {
    if (r.status === 'not_isolated') return r.reason;
    if (r.status === 'failed') return `network check failed: ${r.reason}`;
    return null;
  }
}
