/**
 * One HTTP attempt of a delivery: a POST to the checked address, no redirects (Node's http client
 * follows none; a 3xx is just a status code), a deadline over the whole exchange, and at most
 * `maxResponseBytes` of the answer read before the connection is closed. Only the status code is
 * kept: the body is read so that a receiver that answers before reading ours does not see a reset,
 * and dropped. Node's `http`/`https` rather than `fetch`: a request's `lookup` can be pinned to the
 * checked address there (fetch has no per-request resolver), and nothing is followed or pooled.
 */
import http from 'node:http';
import https from 'node:https';
import type { LookupFunction } from 'node:net';
import type { AttemptResult } from './decide.ts';
import type { ResolvedTarget } from './ssrf.ts';

/** Options of one attempt. */
export interface SendOptions {
  headers: Record<string, string>;
  body: string;
  timeoutMs: number;
  maxResponseBytes: number;
  /** Extra TLS options (tests trust their own CA). */
  tls?: https.RequestOptions;
}

/** POSTs `body` to `target` (dialled at `target.address`, never resolved again). */
export function send(target: ResolvedTarget, o: SendOptions): Promise<AttemptResult> {
  // Every lookup the client makes for this request answers the address that was checked.
  const lookup: LookupFunction = (_host, opts, cb) => {
    if ((opts as { all?: boolean }).all) (cb as unknown as (e: null, a: { address: string; family: number }[]) => void)(null, [{ address: target.address, family: target.family }]);
    else cb(null, target.address, target.family);
  };
  const mod = target.url.protocol === 'https:' ? https : http;
  return new Promise<AttemptResult>((resolve) => {
    let settled = false;
    const done = (r: AttemptResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req.destroy();
      resolve(r);
    };
    const req = mod.request(
      target.url,
      {
        method: 'POST',
        lookup,
        agent: false,
        headers: { 'content-type': 'application/json', 'user-agent': 'sandpod-webhooks', 'content-length': String(Buffer.byteLength(o.body)), ...o.headers },
        ...(o.tls ?? {}),
      },
      (res) => {
        const statusCode = res.statusCode ?? 0;
        let read = 0;
        res.on('data', (chunk: Buffer) => {
          read += chunk.length;
          if (read >= o.maxResponseBytes) done({ kind: 'answered', statusCode });
        });
        res.on('end', () => done({ kind: 'answered', statusCode }));
        res.on('error', () => done({ kind: 'answered', statusCode }));
        if (o.maxResponseBytes === 0) done({ kind: 'answered', statusCode });
      },
    );
    const timer = setTimeout(() => done({ kind: 'error', message: `no answer within ${Math.round(o.timeoutMs / 1000)} s` }), o.timeoutMs);
    req.on('error', (err: NodeJS.ErrnoException) => done({ kind: 'error', message: `${err.code ?? 'error'}: ${err.message}`.slice(0, 300) }));
    req.end(o.body);
  });
}
