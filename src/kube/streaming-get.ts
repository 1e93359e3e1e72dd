/**
 * A GET to the API server whose answer streams (watches, log follow), with the kubeconfig's TLS and
 * credentials applied. Node's http rather than client-node's fetch, so the caller owns the request:
 * it can abort it, time its headers and keep its socket alive. Shared by watch.ts and log-stream.ts.
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
