/**
 * `attach` to a running container's stdin and stdout over WebSocket (the kubelet's attach, proxied by
 * the API server), with the same channel protocols as {@link execInContainer}: the client writes
 * stdin as binary frames on channel 0; the server sends stdout on 1, stderr on 2, a `Status` on 3
 * and (v5) 255 to close a channel. The session stays open until the container ends or we close it.
 *
 * Our own small client, as for exec (see exec.ts): client-node's `Attach` pipes into Node streams
 * with no way to learn that the upgrade succeeded before writing, and mishandles v5 close frames.
 */
import type { KubeConfig } from '@kubernetes/client-node';
import WebSocket from 'ws';
import { EXEC_PROTOCOLS, ExecError, onRefusal, streamOptions, type ExecStatus } from './exec.ts';

/** One attach request. */
export interface AttachRequest {
  namespace: string;
  pod: string;
  container: string;
  /** Receives every stdout chunk as it arrives. */
  onStdout?: (chunk: Buffer) => void;
  /** Gives up when the upgrade is not answered within this long. */
  handshakeTimeoutMs?: number;
}

/** An open attach. */
export interface AttachSession {
  /** Writes to the container's stdin; resolves once the frame is handed to the socket. */
  send(data: string | Buffer): Promise<void>;
  /** Settles when the stream ends: the container exited, the pod went, or {@link close} was called. */
  readonly ended: Promise<{ status: ExecStatus | null }>;
  /** Closes the stream (the container's stdin sees EOF when it was declared `stdinOnce`). */
  close(): void;
  readonly protocol: string;
}

/**
 * Attaches to a container; resolves once the server accepted the upgrade. Rejects with
 * {@link ExecError} when it is refused (404 pod gone, 400 container not running or without stdin).
 */
export async function attachToContainer(kc: KubeConfig, req: AttachRequest): Promise<AttachSession> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new ExecError('no current cluster in kubeconfig');
  const q = new URLSearchParams({ container: req.container, stdin: 'true', stdout: 'true', stderr: 'false', tty: 'false' });
  const base = cluster.server.replace(/^http/, 'ws').replace(/\/$/, '');
  const url = `${base}/api/v1/namespaces/${encodeURIComponent(req.namespace)}/pods/${encodeURIComponent(req.pod)}/attach?${q}`;
  const opts = await streamOptions(kc);
  const ws = new WebSocket(url, [...EXEC_PROTOCOLS], { ...opts, perMessageDeflate: false, ...(req.handshakeTimeoutMs ? { handshakeTimeout: req.handshakeTimeoutMs } : {}) });
  let status: ExecStatus | null = null;
  let resolveEnded!: (v: { status: ExecStatus | null }) => void;
  const ended = new Promise<{ status: ExecStatus | null }>((r) => (resolveEnded = r));
  ws.on('message', (data: Buffer, isBinary: boolean) => {
    const buf = isBinary ? data : Buffer.from(data.toString(), 'utf8');
    if (buf.length < 2) return;
    const channel = buf[0];
    const payload = buf.subarray(1);
    if (channel === 1) req.onStdout?.(payload);
    else if (channel === 3) {
      try {
        status = JSON.parse(payload.toString('utf8')) as ExecStatus;
      } catch {
        status = { status: 'Failure', message: payload.toString('utf8') };
      }
    }
  });
  ws.on('close', () => resolveEnded({ status }));
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    onRefusal(ws, 'attach', reject);
    ws.on('error', (err) => {
      if (ws.readyState === ws.CONNECTING || ws.readyState === ws.CLOSED) reject(new ExecError(`attach failed: ${err.message}`, undefined, true));
      resolveEnded({ status });
    });
  });
  return {
    protocol: ws.protocol,
    ended,
    send: (data) =>
      new Promise<void>((resolve, reject) => {
        if (ws.readyState !== ws.OPEN) return reject(new ExecError('attach: the stream is closed'));
        const payload = Buffer.isBuffer(data) ? data : Buffer.from(data, 'utf8');
        ws.send(Buffer.concat([Buffer.from([0]), payload]), { binary: true }, (err) => (err ? reject(err) : resolve()));
      }),
    close: () => {
      if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close(1000);
    },
  };
}
