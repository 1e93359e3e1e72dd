/**
 * `GET /jobs/{id}/events` (issue 12) on the database under test with the real local sandbox: live
 * output before the run ends, finished jobs at once, resume after Last-Event-ID, 404/400, and a slow
 * reader that the server follows at its pace.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listen, startTestService, type TestService } from '../../support/service.ts';
import { allEvents, sseEvents, textOf, type SseEvent } from '../../support/sse.ts';
import type { ServerType } from '@hono/node-server';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { createLogger } from '../../../src/logger.ts';
import { buildWheels } from '../../support/wheel.ts';

let svc: TestService;
let server: ServerType;
let base: string;
const logOut = new PassThrough();
let logText = '';
const WHEELS = buildWheels([{ name: 'evprobe', version: '1.0', modules: { '__init__.py': 'VALUE = 7\n' } }]);
beforeAll(async () => {
  logOut.on('data', (d: Buffer) => (logText += d.toString()));
  svc = await startTestService({ max_stdout_bytes: 4096, pip: { find_links: [WHEELS], no_index: true } }, { logger: createLogger('info', 'json', logOut) });
  server = await listen(svc, 0, '127.0.0.1');
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await svc?.close();
});

type J = Record<string, any>;
async function submit(body: J): Promise<string> {
  const res = await svc.post('/execute/async', body);
  expect(res.status).toBe(202);
  return ((await res.json()) as J).job_id as string;
}
async function finished(id: string): Promise<J> {
  return (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=60`)).json()) as J;
}
const events = (id: string, headers: Record<string, string> = {}, q = '') => fetch(`${base}/jobs/${id}/events${q}`, { headers });

describe('GET /jobs/{id}/events', () => {
  it('a POST /execute run: its creation says starting, once, then running and finished', async () => {
    const res = await svc.post('/execute', { code: 'print("sync")' });
    const id = ((await res.json()) as J).execution_id as string;
    const seen = await allEvents(await events(id));
    expect(seen.filter((e) => e.event === 'status').map((e) => [e.id === '0' ? 'creation' : 'stored', e.json.phase])).toEqual([
      ['creation', 'starting'],
      ['stored', 'running'],
      ['stored', 'finished'],
    ]);
    expect(textOf(seen, 'stdout')).toBe('sync\n');
  });

  it('streams output as the program writes it: the first chunk arrives before the run ends', async () => {
    const id = await submit({ code: 'import time\nprint("first", flush=True)\ntime.sleep(1.5)\nprint("second")' });
    const res = await events(id);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const seen: SseEvent[] = [];
    let statusAtFirstChunk: string | null = null;
    for await (const e of sseEvents(res)) {
      seen.push(e);
      if (e.event === 'stdout' && statusAtFirstChunk === null) {
        statusAtFirstChunk = ((await (await svc.get(`/jobs/${id}`)).json()) as J).status;
      }
    }
    expect(statusAtFirstChunk).toBe('running');
    expect(textOf(seen, 'stdout')).toBe('first\nsecond\n');
    const phases = seen.filter((e) => e.event === 'status').map((e) => e.json.phase);
    expect(phases).toEqual(['queued', 'starting', 'running', 'finished']);
    const running = seen.find((e) => e.event === 'status' && e.json.phase === 'running')!;
    expect(typeof running.json.timing.startup_ms).toBe('number');
    const end = seen.at(-1)!;
    expect(end.event).toBe('end');
    expect(end.json).toEqual(await (await svc.get(`/jobs/${id}?view=full`)).json());
    // ids increase
    const ids = seen.map((e) => Number(e.id));
    expect([...ids].sort((a, b) => a - b)).toEqual(ids);
    expect(new Set(ids).size).toBe(ids.length);
  });

  it('a finished job answers at once with its final state, artifacts and end; the same on every read', async () => {
    const id = await submit({ code: 'import sys\nprint("out")\nprint("err", file=sys.stderr)\nopen("/output/a.txt","w").write("hello")' });
    const rec = await finished(id);
    expect(rec.status).toBe('succeeded');
    const a = await allEvents(await events(id));
    expect(textOf(a, 'stdout')).toBe('out\n');
    expect(textOf(a, 'stderr')).toBe('err\n');
    const art = a.filter((e) => e.event === 'artifact');
    expect(art.map((e) => e.json.name)).toEqual(['a.txt']);
    expect(art[0]!.json.size_bytes ?? art[0]!.json.size).toBe(5);
    expect(a.filter((e) => e.event === 'status').at(-1)!.json).toMatchObject({ status: 'succeeded', phase: 'finished' });
    expect(a.at(-1)!.event).toBe('end');
    const b = await allEvents(await events(id));
    expect(b.map((e) => [e.id, e.event, e.data])).toEqual(a.map((e) => [e.id, e.event, e.data]));
  });

  it('resumes after Last-Event-ID (header or query) with exactly the later events', async () => {
    const id = await submit({ code: 'print("a")\nprint("b")' });
    await finished(id);
    const all = await allEvents(await events(id));
    expect(all.length).toBeGreaterThan(3);
    for (const cut of [0, 1, all.length - 2]) {
      const after = all[cut]!.id!;
      const rest = await allEvents(await events(id, { 'Last-Event-ID': after }));
      expect(rest.map((e) => e.id)).toEqual(all.slice(cut + 1).map((e) => e.id));
      const viaQuery = await allEvents(await events(id, {}, `?last_event_id=${after}`));
      expect(viaQuery.map((e) => e.data)).toEqual(all.slice(cut + 1).map((e) => e.data));
    }
    // After the last event there is nothing more: the stream ends at once.
    expect(await allEvents(await events(id, { 'Last-Event-ID': all.at(-1)!.id! }))).toEqual([]);
  });

  it('a program printing the control lines of the runner only prints: the run ends when it ends', async () => {
    const id = await submit({ code: 'import time\nprint("done 0", flush=True)\nprint("execution", flush=True)\ntime.sleep(0.5)\nprint("after")' });
    const evs = await allEvents(await events(id));
    expect(textOf(evs, 'stdout')).toBe('done 0\nexecution\nafter\n');
    expect(evs.at(-1)!.json).toMatchObject({ status: 'succeeded', stdout: 'done 0\nexecution\nafter\n' });
  });

  it('stderr chunks and an installing-free run report no installing phase', async () => {
    const id = await submit({ code: 'import sys\nsys.stderr.write("warn\\n")\nprint("ok")' });
    const evs = await allEvents(await events(id));
    expect(textOf(evs, 'stderr')).toBe('warn\n');
    expect(evs.filter((e) => e.event === 'status').map((e) => e.json.phase)).not.toContain('installing');
  });

  it('requirements: an installing phase between starting and running, with timing', async () => {
    const id = await submit({ code: 'import evprobe\nprint(evprobe.VALUE)', requirements: ['evprobe==1.0'] });
    const evs = await allEvents(await events(id));
    expect(evs.at(-1)!.json).toMatchObject({ status: 'succeeded', stdout: '7\n' });
    const st = evs.filter((e) => e.event === 'status').map((e) => e.json);
    expect(st.map((x) => x.phase)).toEqual(['queued', 'starting', 'installing', 'running', 'finished']);
    const running = st.find((x) => x.phase === 'running')!;
    expect(running.timing.dep_install_ms).toBeGreaterThanOrEqual(0);
    expect(running.timing.startup_ms).toBeGreaterThanOrEqual(running.timing.dep_install_ms);
    // Issue 12 point 5: the log says so while requirements install, between start and program start.
    const msgs = logText
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as J)
      .filter((l) => l.execution_id === id)
      .map((l) => l.msg);
    expect(msgs.indexOf('installing requirements')).toBeGreaterThan(msgs.indexOf('run starting; installing requirements first'));
    expect(msgs.indexOf('program started')).toBeGreaterThan(msgs.indexOf('installing requirements'));
  });

  it('unknown id → 404 error body; a malformed Last-Event-ID → 400', async () => {
    const r = await events('00000000-0000-0000-0000-000000000000');
    expect(r.status).toBe(404);
    expect(await r.json()).toMatchObject({ code: 'not_found' });
    const id = await submit({ code: 'pass' });
    const bad = await events(id, { 'Last-Event-ID': 'abc' });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as J).detail).toMatch(/Last-Event-ID/);
  });

  it('output past max_stdout_bytes is cut like the record, with one truncated event', async () => {
    const id = await submit({ code: 'import sys\nsys.stdout.write("x" * 10000)\nsys.stdout.flush()' });
    const evs = await allEvents(await events(id));
    const rec = evs.at(-1)!.json;
    expect(rec.stdout_truncated).toBe(true);
    expect(textOf(evs, 'stdout')).toBe(rec.stdout);
    expect(evs.filter((e) => e.event === 'truncated').map((e) => e.json)).toEqual([{ stream: 'stdout' }]);
  });

  it('a queued job shows queued first; a cancelled one ends with its record', async () => {
    // Hold both worker slots so the job waits in the queue.
    const blockers = [await submit({ code: 'import time; time.sleep(3)' }), await submit({ code: 'import time; time.sleep(3)' })];
    const id = await submit({ code: 'print(1)' });
    const res = await events(id);
    const it = sseEvents(res);
    const first = (await it.next()).value as SseEvent;
    expect(first).toMatchObject({ id: '0', event: 'status' });
    expect(first.json).toMatchObject({ status: 'queued', phase: 'queued' });
    await svc.post(`/jobs/${id}/cancel`);
    const rest: SseEvent[] = [];
    for await (const e of it) rest.push(e);
    expect(rest.at(-1)!.event).toBe('end');
    expect(rest.at(-1)!.json.status).toBe('cancelled');
    for (const b of blockers) await finished(b);
  });
});

describe('shutdown', () => {
  it('open streams end (without `end`) when the service stops, so their clients reconnect elsewhere', async () => {
    const s = await startTestService({});
    const res = await s.post('/execute/async', { code: 'import time\nprint("up", flush=True)\ntime.sleep(60)' });
    const id = ((await res.json()) as J).job_id as string;
    const seen: SseEvent[] = [];
    let ended = false;
    const reading = (async () => {
      for await (const e of sseEvents(await s.get(`/jobs/${id}/events`))) seen.push(e);
      ended = true;
    })();
    for (let i = 0; i < 200 && !seen.some((e) => e.event === 'stdout'); i++) await new Promise((r) => setTimeout(r, 50));
    expect(textOf(seen, 'stdout')).toBe('up\n');
    await s.close();
    await Promise.race([reading, new Promise((r) => setTimeout(r, 10_000))]);
    expect(ended).toBe(true);
    expect(seen.some((e) => e.event === 'end')).toBe(false);
  });
});
