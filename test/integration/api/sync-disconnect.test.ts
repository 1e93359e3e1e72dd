/**
 * A sync request whose client goes away while it waits for a worker slot gives its place up: it is
 * never recorded and never runs (the signal of POST /execute on the Node server, clientGoneSignal).
 */
import http from 'node:http';
import { describe, expect, it } from 'vitest';
import { useServedService } from '../../support/service.ts';

function post(url: string, body: unknown): { req: http.ClientRequest; answer: Promise<{ status: number; body: Record<string, unknown> }> } {
  const data = JSON.stringify(body);
  let req!: http.ClientRequest;
  const answer = new Promise<{ status: number; body: Record<string, unknown> }>((resolve, reject) => {
    req = http.request(`${url}/execute`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as Record<string, unknown> }));
    });
    req.on('error', reject);
    req.end(data);
  });
  return { req, answer };
}

describe('POST /execute, client gone while waiting for a slot', () => {
  const served = useServedService({ max_workers: 1, warm_pool: { sizes: {} } });

  it('is never recorded nor run, and the slot goes to the next request', async () => {
    const busy = post(served.url, { code: 'import time\ntime.sleep(2)\nprint("busy")' });
    // The one slot is taken once the first run is recorded.
    for (let i = 0; i < 200; i++) {
      const running = await served.svc.db.kysely.selectFrom('executions').select('id').where('status', '=', 'running').execute();
      if (running.length > 0) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    const gone = post(served.url, { code: 'print("gone-away")' });
    gone.answer.catch(() => {});
    await new Promise((r) => setTimeout(r, 300));
    gone.req.destroy();
    const next = post(served.url, { code: 'print("next")' });
    expect((await busy.answer).body).toMatchObject({ success: true, stdout: 'busy\n' });
    expect((await next.answer).body).toMatchObject({ success: true, stdout: 'next\n' });
    const codes = (await served.svc.db.kysely.selectFrom('executions').select('code').execute()).map((r) => r.code);
    expect(codes).toHaveLength(2);
    expect(codes.some((c) => c.includes('gone-away'))).toBe(false);
  });
});
