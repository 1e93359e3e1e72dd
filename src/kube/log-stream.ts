/**
 * Following a container's log (`GET /api/v1/namespaces/{ns}/pods/{pod}/log?follow=true`): the API
 * server streams the container's output as it is written and ends the response when the container
 * ends. Bytes are handed over raw (a chunk may split a UTF-8 sequence; the consumer decodes).
 *
 * On node's http(s) like watch.ts, for the same reason: the response headers get a deadline and the
 * request can be aborted at any time. `limitBytes` bounds what the server sends (the service needs
 * no more than its per-run cap). A follow that breaks mid-stream is reported; resuming is the
 * caller's choice (`sinceTime` cannot resume exactly, so the service does not try).
 */
import http from 'node:http';
import type { KubeConfig } from '@kubernetes/client-node';
import { onRefusedAnswer, prepareStreamingGet } from './streaming-get.ts';

/** Options of {@link followLog}. */
export interface LogFollowRequest {
  kubeConfig: KubeConfig;
  namespace: string;
  pod: string;
  container: string;
  /** The server stops after this many bytes. */
  limitBytes?: number;
  /** Response headers must arrive within this, ms. */
  connectTimeoutMs: number;
  onData: (chunk: Buffer) => void;
  /** Once: null when the server ended the log (the container ended, or `limitBytes`), else why it stopped. Not after `abort()`. */
  onEnd: (err: Error | null) => void;
}

/** A log being followed. */
export interface LogFollowHandle {
  abort(): void;
  /** Settles when the follow ended, whichever way (abort included). */
  readonly done: Promise<void>;
}

/** A non-200 answer (e.g. 400 while the container is still waiting to start). */
export class LogHttpError extends Error {
  override readonly name = 'LogHttpError';
  constructor(
    message: string,
    readonly statusCode: number,
  ) {
    super(message);
  }
}

/** Starts following; never throws (failures go to `onEnd`). */
export function followLog(r: LogFollowRequest): LogFollowHandle {
  let ended = false;
  let req: http.ClientRequest | null = null;
  let resolveDone!: () => void;
  const done = new Promise<void>((res) => (resolveDone = res));
  const path = `/api/v1/namespaces/${encodeURIComponent(r.namespace)}/pods/${encodeURIComponent(r.pod)}/log`;
  const connectTimer = setTimeout(() => finish(new Error(`log ${r.pod}/${r.container}: no answer within ${r.connectTimeoutMs} ms`)), r.connectTimeoutMs);
  const finish = (err: Error | null, notify = true) => {
    if (ended) return;
    ended = true;
    clearTimeout(connectTimer);
    req?.destroy();
    if (notify) r.onEnd(err);
    resolveDone();
  };
  void start().catch((err: unknown) => finish(err instanceof Error ? err : new Error(String(err))));
  return { abort: () => finish(null, false), done };

  async function start(): Promise<void> {
    const send = await prepareStreamingGet(r.kubeConfig, path, { container: r.container, follow: true, ...(r.limitBytes !== undefined ? { limitBytes: r.limitBytes } : {}) }, '*/*');
    if (ended) return;
    req = send();
    req.on('error', (err) => finish(err));
    req.on('response', (res) => {
      clearTimeout(connectTimer);
      if (res.statusCode !== 200) {
        onRefusedAnswer(res, (status, msg) => finish(new LogHttpError(`log ${r.pod}/${r.container}: HTTP ${status || '?'} ${msg}`.trim(), status)));
        return;
      }
      res.on('data', (chunk: Buffer) => {
        if (!ended) r.onData(chunk);
      });
      res.on('end', () => finish(null));
      res.on('error', (err) => finish(err));
      res.on('close', () => finish(new Error(`log ${r.pod}/${r.container}: connection closed mid-stream`)));
    });
    req.end();
  }
}
