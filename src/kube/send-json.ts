/**
 * A JSON write to the API server whose answer is not turned into the client's model objects: read
 * as plain JSON, or not at all, for calls whose answer is a copy of what was sent. A run's Secret create is one (about 90 KB with the
 * runner): through the generated client every run serialized it, parsed the 90 KB echo and turned
 * it into model objects, the largest share of a run's CPU and garbage in the replica after the
 * watches'. Refused answers become the client's own `ApiException`, so callers tell 409 from 500 as
 * before.
 */
import http from 'node:http';
import https from 'node:https';
import { ApiException, type KubeConfig } from '@kubernetes/client-node';
import { jsonParts } from './json-bytes.ts';

/** One write: `body` goes as JSON to `apiPath` (with `query`). */
export interface JsonWrite {
  method: 'POST' | 'PUT';
  apiPath: string;
  query: Record<string, string>;
  body: unknown;
  signal: AbortSignal;
  /** Parse the answer of a 2xx as JSON and give it back (it is discarded unread otherwise). */
  read?: boolean;
}

/**
 * Sends the write over a connection of `agentFor` (given the kubeconfig's TLS options); resolves
 * with the status of a 2xx answer, whose body is discarded unread; rejects with an `ApiException`
 * for any other status, with the body of the answer (its Status) as the client would give it.
 */
export async function sendJson(kc: KubeConfig, agentFor: (tls: https.RequestOptions, secure: boolean) => http.Agent, w: JsonWrite): Promise<{ status: number; json?: unknown }> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('no current cluster in kubeconfig');
  const url = new URL(cluster.server.replace(/\/$/, '') + w.apiPath);
  for (const [k, v] of Object.entries(w.query)) url.searchParams.set(k, v);
  const opts: https.RequestOptions = {};
  await kc.applyToHTTPSOptions(opts);
  w.signal.throwIfAborted();
  const body = jsonParts(w.body);
  const headers: http.OutgoingHttpHeaders = {
    ...(opts.headers as http.OutgoingHttpHeaders | undefined),
    accept: 'application/json',
    'content-type': 'application/json',
    'content-length': body.reduce((n, b) => n + b.length, 0),
  };
  if (opts.auth) headers.authorization = `Basic ${Buffer.from(opts.auth).toString('base64')}`;
  const secure = url.protocol === 'https:';
  const mod = secure ? https : http;
  return new Promise<{ status: number; json?: unknown }>((resolve, reject) => {
    // TLS material travels with the agent (made from these options), not per request: a request's own
    // TLS options would make it a socket pool apart from the generated client's calls.
    const req = mod.request(url, { method: w.method, headers, agent: agentFor(opts, secure), signal: w.signal });
    req.on('error', reject);
    req.on('response', (res) => {
      const status = res.statusCode ?? 0;
      res.on('error', reject);
      if (status >= 200 && status < 300 && !w.read) {
        res.on('end', () => resolve({ status }));
        res.resume();
        return;
      }
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        if (w.read || text.length < 64_000) text += c;
      });
      res.on('end', () => {
        if (status < 200 || status >= 300) return reject(new ApiException(status, `HTTP-Code: ${status} Message: Unknown API Status Code!`, text, res.headers as Record<string, string>));
        try {
          resolve({ status, json: JSON.parse(text) as unknown });
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
    });
    // Written in the tick the request is made: buffered together until it has its socket.
    for (const part of body) req.write(part);
    req.end();
  });
}
