/**
 * `exec` into a container over WebSocket, speaking the Kubernetes channel protocols
 * `v5.channel.k8s.io` and `v4.channel.k8s.io`: every binary frame starts with a channel byte
 * (1 stdout, 2 stderr, 3 status as a JSON `Status`; v5 adds 255 = "close channel N").
 *
 * Our own small client rather than client-node's `Exec`: that one routes v5 close frames to
 * `process.stdout` and throws on channel 255, and it cannot apply backpressure to a large stream.
 */
import https from 'node:https';
import type { Writable } from 'node:stream';
import type { KubeConfig } from '@kubernetes/client-node';
import WebSocket from 'ws';
import { onRefusedAnswer } from './streaming-get.ts';

/**
 * The agents exec and attach streams connect through, one per kubeconfig: no connection is ever
 * reused (each upgrade takes its socket for good), but TLS sessions are, so each stream after the
 * first resumes a session instead of a full handshake with the API server (a new connection took
 * 26 ms, a resumed one 18 ms, against kcluster on a loaded 2-core machine: a warm run's program goes
 * by attach). client-node makes a new agent per call, with no session cache to share.
 */
const streamAgents = new WeakMap<KubeConfig, https.Agent>();

/** WebSocket options of an exec or attach (the kubeconfig's TLS options applied). */
export async function streamOptions(kc: KubeConfig): Promise<WebSocket.ClientOptions> {
  const opts: WebSocket.ClientOptions = {};
  await kc.applyToHTTPSOptions(opts);
  const made = opts.agent as https.Agent | undefined;
  // Proxy agents (a cluster with `proxy-url`) are left as they are.
  if (!made || made.constructor !== https.Agent) return opts;
  let agent = streamAgents.get(kc);
  if (!agent) {
    const options = (made as https.Agent & { options?: https.AgentOptions }).options ?? {};
    agent = new https.Agent({ ...options, keepAlive: false, maxCachedSessions: 16 });
    streamAgents.set(kc, agent);
  }
  made.destroy();
  return { ...opts, agent };
}

/** The protocols we offer, preferred first. */
export const EXEC_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'] as const;

/** The `Status` a command ended with (channel 3). */
export interface ExecStatus {
  status?: string;
  message?: string;
  reason?: string;
  details?: { causes?: { reason?: string; message?: string }[] };
}

/** Outcome of one exec. */
export interface ExecResult {
  /** Exit code: 0 on `Success`, the `ExitCode` cause on `NonZeroExitCode`, null when unknown. */
  exitCode: number | null;
  status: ExecStatus | null;
  /** Up to 64 KiB of stderr. */
  stderr: string;
  protocol: string;
}

/** One exec request. */
export interface ExecRequest {
  namespace: string;
  pod: string;
  container: string;
  command: readonly string[];
  /** Receives stdout; the socket is paused while it pushes back. Ended when the command ends. */
  stdout?: Writable;
  signal?: AbortSignal;
  /** Gives up (and closes the socket) after this long. */
  timeoutMs?: number;
  /**
   * Gives up when the upgrade is not answered within this long (an API server that accepts the
   * connection and never answers); default: `timeoutMs`.
   */
  handshakeTimeoutMs?: number;
}

const MAX_STDERR = 64 * 1024;

/** Exit code of an exec `Status`. */
export function exitCodeOf(status: ExecStatus | null): number | null {
  if (!status) return null;
  if (status.status === 'Success') return 0;
  const cause = status.details?.causes?.find((c) => c.reason === 'ExitCode');
  const n = cause?.message !== undefined ? Number(cause.message) : NaN;
  return Number.isInteger(n) ? n : null;
}

/** Thrown when the exec could not be set up or broke before its status arrived. */
export class ExecError extends Error {
  override readonly name = 'ExecError';
  constructor(
    message: string,
    readonly httpStatus?: number,
    /**
     * The API server did not take the exec: no answer to the upgrade, no connection, or a 5xx/429
     * refusal. Says nothing about the pod; trying again later may work.
     */
    readonly apiUnavailable = httpStatus !== undefined && (httpStatus >= 500 || httpStatus === 429),
  ) {
    super(message);
  }
}

/**
 * Whether an exec or attach failed at the upgrade (an HTTP refusal, anywhere in its causes): no stream
 * was opened, so nothing ran and nothing was consumed (a container not started yet is refused so).
 */
export function upgradeRefused(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = e.cause) if (e instanceof ExecError && e.httpStatus !== undefined) return true;
  return false;
}

/**
 * Turns a refused WebSocket upgrade (the API server answered with an HTTP status instead of 101) into
 * an {@link ExecError} carrying that status and the Status message of its body.
 */
export function onRefusal(ws: WebSocket, what: 'exec' | 'attach', fail: (err: ExecError) => void): void {
  ws.on('unexpected-response', (_req, res) => {
    onRefusedAnswer(res, (status, msg) => fail(new ExecError(`${what} refused: HTTP ${status || '?'} ${msg}`.trim(), res.statusCode)));
  });
}

/**
 * Runs a command in a container and resolves once the server closed the stream. Rejects with
 * {@link ExecError} when the upgrade is refused (e.g. 404: pod gone; 400: container not running) or
 * the socket breaks before a status arrived.
 */
export async function execInContainer(kc: KubeConfig, req: ExecRequest): Promise<ExecResult> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new ExecError('no current cluster in kubeconfig');
  const q = new URLSearchParams();
  for (const c of req.command) q.append('command', c);
  q.set('container', req.container);
  q.set('stdout', 'true');
  q.set('stderr', 'true');
  const base = cluster.server.replace(/^http/, 'ws').replace(/\/$/, '');
  const url = `${base}/api/v1/namespaces/${encodeURIComponent(req.namespace)}/pods/${encodeURIComponent(req.pod)}/exec?${q}`;
  const opts = await streamOptions(kc);

  return new Promise<ExecResult>((resolve, reject) => {
    const handshakeTimeout = req.handshakeTimeoutMs ?? req.timeoutMs;
    const ws = new WebSocket(url, [...EXEC_PROTOCOLS], { ...opts, perMessageDeflate: false, ...(handshakeTimeout ? { handshakeTimeout } : {}) });
    let status: ExecStatus | null = null;
    let stderr = '';
    let settled = false;
    let stdoutEnded = false;
    const endStdout = () => {
      if (!stdoutEnded && req.stdout) {
        stdoutEnded = true;
        req.stdout.end();
      }
    };
    const timer = req.timeoutMs ? setTimeout(() => fail(new ExecError(`exec timed out after ${req.timeoutMs} ms`)), req.timeoutMs) : null;
    const onAbort = () => fail(new ExecError('exec aborted'));
    req.signal?.addEventListener('abort', onAbort, { once: true });
    const cleanup = () => {
      if (timer) clearTimeout(timer);
      req.signal?.removeEventListener('abort', onAbort);
    };
    function fail(err: Error) {
      if (settled) return;
      settled = true;
      cleanup();
      if (req.stdout && !stdoutEnded) {
        stdoutEnded = true;
        req.stdout.destroy(err);
      }
      ws.terminate();
      reject(err);
    }
    onRefusal(ws, 'exec', fail);
    ws.on('error', (err) => {
      if (/handshake has timed out/.test(err.message)) fail(new ExecError(`exec: the API server did not answer the upgrade within ${handshakeTimeout} ms`, undefined, true));
      // Before the upgrade was answered nothing reached the pod: the API server is out of reach.
      else fail(new ExecError(`exec failed: ${err.message}`, undefined, ws.readyState === ws.CONNECTING));
    });
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      const buf = isBinary ? data : Buffer.from(data.toString(), 'utf8');
      if (buf.length === 0) return;
      const channel = buf[0];
      const payload = buf.subarray(1);
      // Servers may open each channel with an empty frame; it carries nothing (not even a status).
      if (payload.length === 0) return;
      if (channel === 1) {
        if (req.stdout && !stdoutEnded && payload.length > 0 && !req.stdout.write(payload)) {
          // Backpressure: stop reading the socket until the consumer drains.
          ws.pause();
          req.stdout.once('drain', () => ws.resume());
        }
      } else if (channel === 2) {
        if (stderr.length < MAX_STDERR) stderr += payload.toString('utf8').slice(0, MAX_STDERR - stderr.length);
      } else if (channel === 3) {
        try {
          status = JSON.parse(payload.toString('utf8')) as ExecStatus;
        } catch {
          status = { status: 'Failure', message: payload.toString('utf8') };
        }
      } else if (channel === 255) {
        // v5: the server closed one of its channels; stdout's close means no more data.
        if (payload[0] === 1) endStdout();
      }
      // Other channels (resize, or an empty first frame some servers send) are ignored.
    });
    ws.on('close', () => {
      if (settled) return;
      settled = true;
      cleanup();
      endStdout();
      if (status === null) {
        reject(new ExecError('exec stream closed before the command ended (no status)'));
        return;
      }
      resolve({ exitCode: exitCodeOf(status), status, stderr, protocol: ws.protocol });
    });
  });
}
