/**
 * Event streams under load (issue 22 item 8): open streams are capped per token and in all (429 with
 * a clear message, released when a stream ends), and the streams watching one run share one reader
 * of the table instead of each reading it.
 */
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listen, startTestService, type TestService } from '../../support/service.ts';
import { allEvents, sseEvents, textOf, type SseEvent } from '../../support/sse.ts';

type J = Record<string, any>;

async function serve(config: Record<string, unknown>): Promise<{ svc: TestService; server: ServerType; base: string }> {
  const svc = await startTestService({ sandbox_engine: 'process', ...config });
  const server = await listen(svc, 0, '127.0.0.1');
  return { svc, server, base: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

async function close(s: { svc: TestService; server: ServerType } | undefined): Promise<void> {
  if (!s) return;
  await new Promise((r) => s.server.close(r));
  await s.svc.close();
}

/** An open stream that has delivered its first event (so the server counts it), and a way to close it. */
async function openStream(base: string, id: string, headers: Record<string, string> = {}): Promise<{ res: Response; close: () => void }> {
  const ctl = new AbortController();
  const res = await fetch(`${base}/jobs/${id}/events`, { headers, signal: ctl.signal });
  return { res, close: () => ctl.abort() };
}

describe('caps on open event streams', () => {
  const A = 'stream-cap-token-aaaaaaaaaaaa';
  const B = 'stream-cap-token-bbbbbbbbbbbb';
  const C = 'stream-cap-token-cccccccccccc';
  let s: Awaited<ReturnType<typeof serve>>;
  let job: string;
  const auth = (t: string) => ({ authorization: `Bearer ${t}` });
  const open = () => s.svc.metrics.eventStreams.get().then((m) => m.values[0]?.value ?? 0);
  const refused = async (reason: string) => (await s.svc.metrics.eventStreamsRefused.get()).values.find((v) => v.labels.reason === reason)?.value ?? 0;

  beforeAll(async () => {
    s = await serve({ auth: { tokens: [A, B, C] }, http: { max_event_streams: 4, max_event_streams_per_token: 2 } });
    const res = await s.svc.post('/execute/async', { code: 'import time; time.sleep(60)' }, auth(A));
    job = ((await res.json()) as J).job_id as string;
  }, 120_000);
  afterAll(async () => {
    await s?.svc.post(`/jobs/${job}/cancel`, undefined, auth(A));
    await close(s);
  });

  it('per token, then in all: 429 with what was reached; a closed stream frees its place', async () => {
    const a1 = await openStream(s.base, job, auth(A));
    const a2 = await openStream(s.base, job, auth(A));
    expect([a1.res.status, a2.res.status]).toEqual([200, 200]);
    const a3 = await fetch(`${s.base}/jobs/${job}/events`, { headers: auth(A) });
    expect(a3.status).toBe(429);
    expect(a3.headers.get('retry-after')).toBe('5');
    const body = (await a3.json()) as J;
    expect(body).toMatchObject({ code: 'too_many_requests', detail: expect.stringContaining('http.max_event_streams_per_token 2') });
    // Another token has its own allowance, up to the total.
    const b1 = await openStream(s.base, job, auth(B));
    const b2 = await openStream(s.base, job, auth(B));
    expect([b1.res.status, b2.res.status]).toEqual([200, 200]);
    expect(await open()).toBe(4);
    const c1 = await fetch(`${s.base}/jobs/${job}/events`, { headers: auth(C) });
    expect(c1.status).toBe(429);
    expect(((await c1.json()) as J).detail).toContain('http.max_event_streams 4');
    expect(await refused('per_token')).toBe(1);
    expect(await refused('total')).toBe(1);
    // Closing one frees a place, for any token.
    a1.close();
    await expect.poll(open, { timeout: 10_000 }).toBe(3);
    const c2 = await openStream(s.base, job, auth(C));
    expect(c2.res.status).toBe(200);
    for (const st of [a2, b1, b2, c2]) st.close();
    await expect.poll(open, { timeout: 10_000 }).toBe(0);
  }, 60_000);

  it('a stream that ends by itself (a finished job) gives its place back', async () => {
    const res = await s.svc.post('/execute', { code: 'print("done")' }, auth(A));
    const id = ((await res.json()) as J).execution_id as string;
    for (let i = 0; i < 5; i++) {
      const seen = await allEvents(await fetch(`${s.base}/jobs/${id}/events`, { headers: auth(A) }));
      expect(seen.at(-1)?.event).toBe('end');
    }
    await expect.poll(open, { timeout: 10_000 }).toBe(0);
  }, 60_000);
});

describe('one reader per run', () => {
  let s: Awaited<ReturnType<typeof serve>>;
  beforeAll(async () => {
    s = await serve({});
  }, 120_000);
  afterAll(() => close(s));

  it('20 streams on one run read its events from the table about once, and all get the same events', async () => {
    const code = 'import time\ntime.sleep(2)\nfor i in range(8):\n    print(str(i) * 2000, flush=True)\n    time.sleep(0.1)\ntime.sleep(0.5)\n';
    const res = await s.svc.post('/execute/async', { code });
    const id = ((await res.json()) as J).job_id as string;
    const before = s.svc.events.dataBytesRead;
    const streams = await Promise.all(Array.from({ length: 20 }, () => fetch(`${s.base}/jobs/${id}/events`)));
    // Each has its first event before the program writes anything (it sleeps 2 s first).
    const iters = streams.map((r) => sseEvents(r));
    const firsts = await Promise.all(iters.map((it) => it.next()));
    expect(firsts.every((f) => (f.value as SseEvent).event === 'status')).toBe(true);
    expect(s.svc.events.watchedRuns).toBe(1);
    const rests = await Promise.all(
      iters.map(async (it) => {
        const out: SseEvent[] = [];
        for await (const e of it) out.push(e);
        return out;
      }),
    );
    const shared = s.svc.events.dataBytesRead - before;
    const texts = rests.map((r) => textOf(r, 'stdout'));
    expect(new Set(texts).size).toBe(1);
    expect(texts[0]!.length).toBe(8 * 2001);
    expect(rests.every((r) => r.at(-1)?.event === 'end')).toBe(true);
    // What one stream alone reads of the same run (a fresh reader: the others have ended).
    await expect.poll(() => s.svc.events.watchedRuns, { timeout: 10_000 }).toBe(0);
    const alone0 = s.svc.events.dataBytesRead;
    await allEvents(await fetch(`${s.base}/jobs/${id}/events`));
    const alone = s.svc.events.dataBytesRead - alone0;
    expect(alone).toBeGreaterThan(8 * 2000);
    // Twenty streams cost about one reading, not twenty.
    expect(shared).toBeLessThan(2 * alone);
  }, 60_000);

  it('a stream that joins late, behind what the shared reader keeps, catches up from the table and then shares it', async () => {
    const late = await serve({ max_stdout_bytes: 4 * 1024 * 1024 });
    try {
      const code = 'import sys, time\nfor i in range(160):\n    sys.stdout.write(("%05d" % i) + "y" * 16379)\n    sys.stdout.flush()\n    time.sleep(0.01)\ntime.sleep(5)\n';
      const id = ((await (await late.svc.post('/execute/async', { code })).json()) as J).job_id as string;
      const early = allEvents(await fetch(`${late.base}/jobs/${id}/events`));
      // Wait until well past what the shared reader keeps (64 events) is stored, then join from the start.
      const rec = async () => (await (await late.svc.get(`/jobs/${id}`)).json()) as J;
      await expect.poll(async () => (await rec()).status, { timeout: 30_000 }).toBe('running');
      await new Promise((r) => setTimeout(r, 3000));
      // Still live (the program sleeps at its end), so the join goes through the running reader.
      expect((await rec()).status).toBe('running');
      expect(late.svc.events.watchedRuns).toBe(1);
      const catchUps = late.svc.events.catchUpQueries;
      const joined = await allEvents(await fetch(`${late.base}/jobs/${id}/events`));
      const first = await early;
      const expected = Array.from({ length: 160 }, (_, i) => String(i).padStart(5, '0') + 'y'.repeat(16379)).join('');
      expect(textOf(first, 'stdout') === expected).toBe(true);
      expect(textOf(joined, 'stdout') === expected).toBe(true);
      expect(joined.map((e) => e.id)).toEqual(first.map((e) => e.id));
      // It read its own pages up to the shared buffer (at least the ~100 events before it), then shared.
      expect(late.svc.events.catchUpQueries - catchUps).toBeGreaterThanOrEqual(3);
    } finally {
      await close(late);
    }
  }, 90_000);
});
