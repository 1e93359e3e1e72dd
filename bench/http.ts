/**
 * The benchmark's HTTP client: `node:http` with one keep-alive connection per origin.
 *
 * Why not `fetch`: the benchmark's client runs in the service's own process, and undici's fetch
 * (WHATWG streams for every body, a Request, Headers and AbortSignal per call) costs about 0.4 ms of
 * CPU per request on this kind of machine, on the same event loop the service answers from. That is
 * the client's cost, not the service's; a sync warm run takes about 10 ms in all, so it would be a
 * few percent of every measurement. This client does what curl would: one request, one buffered
 * body, parsed as JSON.
 */
import http from 'node:http';

const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });

/** Status and parsed JSON body of one request. */
export interface JsonAnswer {
  status: number;
  body: unknown;
}

/** Sends `body` (JSON) to `url` with `method` and resolves the status and the parsed answer. */
export function requestJson(url: string, method: 'GET' | 'POST', body?: unknown): Promise<JsonAnswer> {
  const data = body === undefined ? null : typeof body === 'string' ? body : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const headers: Record<string, string | number> = data === null ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) };
    const req = http.request(url, { method, agent, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        try {
          resolve({ status: res.statusCode ?? 0, body: text === '' ? null : JSON.parse(text) });
        } catch (err) {
          reject(new Error(`${method} ${url}: answer ${res.statusCode} is not JSON (${(err as Error).message}): ${text.slice(0, 200)}`));
        }
      });
    });
    req.on('error', reject);
    req.end(data ?? undefined);
  });
}

/** POST `body` as JSON; resolves the parsed answer. */
export async function postJson(url: string, body: unknown): Promise<JsonAnswer> {
  return requestJson(url, 'POST', body);
}

/** GET; resolves the parsed answer. */
export async function getJson(url: string): Promise<JsonAnswer> {
  return requestJson(url, 'GET');
}

/** Closes the kept-alive connections (at the end of a run, so the process can exit). */
export function closeConnections(): void {
  agent.destroy();
}
