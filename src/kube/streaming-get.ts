/**
 * A GET to the API server whose answer streams (watches, log follow), with the kubeconfig's TLS and
 * credentials applied. Node's http rather than client-node's fetch, so the caller owns the request:
 * it can abort it, time its headers and keep its socket alive. Shared by watch.ts and log-stream.ts,
 * with the reading of a refused answer (exec.ts and attach.ts use that too).
 */
import http from 'node:http';
import https from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node';

/**
 * Resolves the URL and credentials (which may take I/O), then gives a function that sends the
 * request: the caller can check whether it still wants it in between.
 */
export async function prepareStreamingGet(
  kubeConfig: KubeConfig,
  apiPath: string,
  query: Record<string, string | number | boolean>,
  accept: string,
): Promise<() => http.ClientRequest> {
  const cluster = kubeConfig.getCurrentCluster();
  if (!cluster) throw new Error('no current cluster in kubeconfig');
  const url = new URL(cluster.server.replace(/\/$/, '') + apiPath);
  for (const [k, v] of Object.entries(query)) url.searchParams.set(k, String(v));
  const opts: https.RequestOptions = {};
  await kubeConfig.applyToHTTPSOptions(opts);
  const headers: http.OutgoingHttpHeaders = { ...(opts.headers as http.OutgoingHttpHeaders | undefined), accept };
  if (opts.auth) headers.authorization = `Basic ${Buffer.from(opts.auth).toString('base64')}`;
  const mod = url.protocol === 'https:' ? https : http;
  return () => {
    const req = mod.request(url, { ...opts, auth: null, method: 'GET', headers });
    req.on('socket', (s) => s.setKeepAlive(true, 30_000));
    return req;
  };
}

/**
 * Reads a refused answer (not 200) to its end and gives its status and the `message` of the Status
 * body it carries (the body itself when it is not JSON), at most 4,000 characters of it.
 */
export function onRefusedAnswer(res: http.IncomingMessage, then: (status: number, message: string) => void): void {
  let body = '';
  res.setEncoding('utf8');
  res.on('data', (c: string) => (body = (body + c).slice(0, 4000)));
  res.on('error', () => undefined);
  res.on('end', () => {
    let msg = body;
    try {
      msg = (JSON.parse(body) as { message?: string }).message ?? body;
    } catch {
      /* not JSON */
    }
    then(res.statusCode ?? 0, msg);
  });
}
