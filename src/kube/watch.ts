/**
 * One watch request (`?watch=true`): newline-delimited JSON events over a chunked response, with two
 * deadlines a real API server can make necessary:
 *
 * - the response headers must arrive within `connectTimeoutMs` (an API server flushes them as soon
 *   as the watch is registered; one that accepted the connection and says nothing is hung);
 * - the stream must have ended by `deadlineMs`: the request carries `timeoutSeconds`, after which a
 *   working server closes the watch cleanly, so a watch still open past it (plus slack) is stalled —
 *   a wedged server, or a connection that died without a FIN — and is aborted with
 *   {@link WatchStalledError}, after which the caller re-lists (events may have been missed).
 *
 * Hand-written on node's http(s) rather than client-node's `Watch`: that one awaits the response
 * headers with no way to abort or time out (its own timeout signal is overwritten before use), so a
 * hung server would hold the informer forever and the abort controller is only handed back after
 * the headers came.
 */
import http from 'node:http';
import type { KubeConfig } from '@kubernetes/client-node';
import { onRefusedAnswer, prepareStreamingGet } from './streaming-get.ts';

/** The watch stayed open past its deadline: the server stopped talking without closing it. */
export class WatchStalledError extends Error {
  override readonly name = 'WatchStalledError';
}

/** A watch the server did not answer (no response headers) within the connect timeout. */
export class WatchConnectTimeoutError extends Error {
  override readonly name = 'WatchConnectTimeoutError';
}

/** A non-200 answer to a watch request (e.g. 410 Gone, 503); `statusCode` is the HTTP status. */
export class WatchHttpError extends Error {
  override readonly name = 'WatchHttpError';
  constructor(
    message: string,
    readonly statusCode: number,
  ) {
    super(message);
  }
}

/** Options of {@link openWatch}. */
export interface WatchRequest {
  kubeConfig: KubeConfig;
  /** URL path of the collection, e.g. `/api/v1/namespaces/x/pods`. */
  path: string;
  /** Query parameters besides `watch=true` (resourceVersion, timeoutSeconds, labelSelector...). */
  query: Record<string, string | number | boolean>;
  connectTimeoutMs: number;
  /** The stream must have ended this long after it was opened. */
  deadlineMs: number;
  /** Each event as the server sent it (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`). */
  onEvent: (type: string, object: unknown) => void;
  /** Called once: `null` for a clean end by the server, else why the watch ended. Not after `abort()`. */
  onEnd: (err: Error | null) => void;
}

/** A running watch. */
export interface WatchHandle {
  /** Ends the watch from our side; `onEnd` is not called after it. */
  abort(): void;
}

/** Opens a watch; never throws (every failure goes to `onEnd`). */
export function openWatch(w: WatchRequest): WatchHandle {
  let ended = false;
  let req: http.ClientRequest | null = null;
  const timers: NodeJS.Timeout[] = [];
  const finish = (err: Error | null, notify = true) => {
    if (ended) return;
    ended = true;
    for (const t of timers) clearTimeout(t);
    req?.destroy();
    if (notify) w.onEnd(err);
  };
  timers.push(setTimeout(() => finish(new WatchConnectTimeoutError(`watch ${w.path}: no answer within ${w.connectTimeoutMs} ms`)), w.connectTimeoutMs));
  timers.push(setTimeout(() => finish(new WatchStalledError(`watch ${w.path}: still open ${w.deadlineMs} ms after it started, past its timeoutSeconds`)), w.deadlineMs));
  void start().catch((err: unknown) => finish(err instanceof Error ? err : new Error(String(err))));
  return { abort: () => finish(null, false) };

  async function start(): Promise<void> {
    const send = await prepareStreamingGet(w.kubeConfig, w.path, { watch: true, ...w.query }, 'application/json');
    if (ended) return;
    req = send();
    req.on('error', (err) => finish(err));
    req.on('response', (res) => {
      clearTimeout(timers[0]);
      if (res.statusCode !== 200) {
        onRefusedAnswer(res, (status, msg) => finish(new WatchHttpError(`watch ${w.path}: HTTP ${status || '?'} ${msg}`.trim(), status)));
        return;
      }
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buf += chunk;
        let nl: number;
        while (!ended && (nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!line) continue;
          let ev: { type?: string; object?: unknown };
          try {
            ev = JSON.parse(line) as { type?: string; object?: unknown };
          } catch {
            continue; // a line that is not an event carries nothing we can use
          }
          if (typeof ev.type === 'string') w.onEvent(ev.type, ev.object);
        }
      });
      res.on('end', () => finish(null));
      res.on('error', (err) => finish(err));
      // After 'end' this is a no-op; before it, the connection broke mid-stream.
      res.on('close', () => finish(new Error(`watch ${w.path}: connection closed mid-stream`)));
    });
    req.end();
  }
}
