/**
 * `GET /sessions/{id}/events` (issue 19) against the real service (HTTP), database and local sandbox:
 * a cell's output arrives while it runs, cells follow in order with their number and record, the
 * session's end is the last event and closes the stream, a finished session replays the same ids,
 * `Last-Event-ID` resumes in the middle of a cell or between cells, and bad input is 4xx. A cell
 * past the session's memory limit is `oom` and ends the session `oom`.
 */
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listen, startTestService, type TestService } from '../../support/service.ts';
import { allEvents, sseEvents, type SseEvent } from '../../support/sse.ts';

const asRoot = process.getuid?.() === 0;
type J = Record<string, any>;

describe.skipIf(!asRoot)('GET /sessions/{id}/events', () => {
  let svc: TestService;
  let server: ServerType;
  let base: string;
  beforeAll(async () => {
    svc = await startTestService({ max_sessions: 3, warm_pool: { sizes: {} }, job_types: [{ name: 'small', memory_limit: '256m' }] });
    server = await listen(svc, 0, '127.0.0.1');
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }, 120_000);
  afterAll(async () => {
    // A failed test may leave a stream open: the server must not wait for it.
    (server as { closeAllConnections?: () => void } | undefined)?.closeAllConnections?.();
    await new Promise((r) => server?.close(r));
    await svc?.close();
  });

  const create = async (body: J = {}): Promise<string> => {
    const res = await svc.post('/sessions', body);
    const j = (await res.json()) as J;
    expect(res.status, JSON.stringify(j)).toBe(201);
    return j.session_id as string;
  };
  const exec = async (id: string, code: string): Promise<J> => (await (await svc.post(`/sessions/${id}/execute`, { code })).json()) as J;
  const close = (id: string) => svc.app.request(`/sessions/${id}`, { method: 'DELETE' });
  const events = (id: string, headers: Record<string, string> = {}, q = '') => fetch(`${base}/sessions/${id}/events${q}`, { headers });
  const shape = (es: SseEvent[]) => es.filter((e) => e.event !== 'status').map((e) => [e.id, e.event, e.json.cell ?? null]);

  it('streams each cell live, in order, and ends with the session', async () => {
    const id = await create();
    const res = await events(id);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/event-stream');
    const it = sseEvents(res);
    const seen: SseEvent[] = [];
    const until = async (pred: (e: SseEvent) => boolean) => {
      for (;;) {
        const n = await it.next();
        if (n.done) throw new Error(`stream ended before the expected event; saw ${JSON.stringify(shape(seen))}`);
        seen.push(n.value);
        if (pred(n.value)) return n.value;
      }
    };
    // Cell 1 waits for a file that the test writes only after its first line was seen: output is live.
    const c1 = svc.post(`/sessions/${id}/execute`, {
      code: 'import os, time, sys\nx = 20\nprint("first", flush=True)\nwhile not os.path.exists("go"): time.sleep(0.05)\nprint("second")\nsys.stderr.write("warn\\n")',
    });
    const started = await until((e) => e.event === 'cell');
    expect(started.id).toBe('1:0');
    expect(started.json).toMatchObject({ cell: 1, status: 'running' });
    const first = await until((e) => e.event === 'stdout');
    expect(first.json).toMatchObject({ data: 'first\n', cell: 1, execution_id: started.json.execution_id });
    const put = await svc.app.request(`/sessions/${id}/files/go`, { method: 'PUT', body: 'x', headers: { 'content-type': 'application/octet-stream' } });
    expect(put.status).toBe(201);
    const end1 = await until((e) => e.event === 'cell_end');
    expect(end1.json).toMatchObject({ cell: 1, execution_id: started.json.execution_id, status: 'succeeded', session_id: id, stdout: 'first\nsecond\n' });
    expect(((await (await c1).json()) as J).execution_id).toBe(started.json.execution_id);
    expect(seen.some((e) => e.event === 'stderr' && e.json.data === 'warn\n' && e.json.cell === 1)).toBe(true);
    // Cell 2 starts after the stream was waiting between cells; a failing cell's end carries its error.
    const c2 = await exec(id, 'print(x + 1)\n1/0');
    const started2 = await until((e) => e.event === 'cell');
    expect(started2).toMatchObject({ id: '2:0', json: { cell: 2, execution_id: c2.execution_id } });
    const end2 = await until((e) => e.event === 'cell_end');
    expect(end2.json).toMatchObject({ cell: 2, status: 'failed', error: { type: 'division_error' } });
    expect(seen.filter((e) => e.json.cell === 2 && e.event === 'stdout').map((e) => e.json.data).join('')).toBe('21\n');
    await close(id);
    const end = await until((e) => e.event === 'end');
    expect(end.id).toBe('2:end');
    expect(end.json).toMatchObject({ session_id: id, status: 'ended', end_reason: 'closed', cells: 2 });
    expect((await it.next()).done).toBe(true);
    // Every id is its cell's, in order; a finished session replays the same events at once.
    const replay = await allEvents(await events(id));
    expect(replay.map((e) => [e.id, e.event])).toEqual(seen.map((e) => [e.id, e.event]));
  }, 120_000);

  it('resumes after Last-Event-ID: inside a cell, between cells, after the end', async () => {
    const id = await create();
    await exec(id, 'print("a")');
    await exec(id, 'print("b")');
    await close(id);
    const all = await allEvents(await events(id));
    expect(shape(all)).toEqual([
      ['1:0', 'cell', 1],
      [expect.stringMatching(/^1:[1-9][0-9]*$/), 'stdout', 1],
      [expect.stringMatching(/^1:[1-9][0-9]*$/), 'cell_end', 1],
      ['2:0', 'cell', 2],
      [expect.stringMatching(/^2:[1-9][0-9]*$/), 'stdout', 2],
      [expect.stringMatching(/^2:[1-9][0-9]*$/), 'cell_end', 2],
      ['2:end', 'end', null],
    ]);
    for (const k of [0, 2, all.findIndex((e) => e.event === 'cell_end'), all.length - 2]) {
      const rest = await allEvents(await events(id, { 'Last-Event-ID': all[k]!.id! }));
      expect(rest.map((e) => e.id), `after ${all[k]!.id}`).toEqual(all.slice(k + 1).map((e) => e.id));
    }
    const viaQuery = await allEvents(await events(id, {}, `?last_event_id=${encodeURIComponent(all[3]!.id!)}`));
    expect(viaQuery.map((e) => e.id)).toEqual(all.slice(4).map((e) => e.id));
    expect(await allEvents(await events(id, { 'Last-Event-ID': '2:end' }))).toEqual([]);
  }, 120_000);

  it('a session with no cell yet: the end alone; 404 for an unknown session, 400 for a malformed Last-Event-ID', async () => {
    const id = await create();
    const res = await events(id);
    await close(id);
    const es = await allEvents(res);
    expect(es.map((e) => [e.id, e.event, e.json.end_reason])).toEqual([['0:end', 'end', 'closed']]);
    expect((await events('no-such-session')).status).toBe(404);
    const bad = await events(id, { 'Last-Event-ID': '12' });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as J).detail).toContain("'{cell}:{id}'");
  }, 120_000);

  it('a cell past the memory limit: its record is oom (137, SPEC §7.2) and the session ends oom, as the stream says', async () => {
    const id = await create({ job_type: 'small' });
    await exec(id, 'kept = 1');
    const r = await exec(id, 'x = []\nwhile True:\n    x.append(bytearray(32 * 1024 * 1024))\n');
    expect(r).toMatchObject({ success: false, exit_code: 137, cell: 2, error: { type: 'oom' } });
    expect(((await (await svc.get(`/jobs/${r.execution_id}`)).json()) as J).status).toBe('oom');
    const s = (await (await svc.get(`/sessions/${id}`)).json()) as J;
    expect(s).toMatchObject({ status: 'ended', end_reason: 'oom', cells: 2 });
    const es = await allEvents(await events(id));
    expect(es.filter((e) => e.event === 'cell_end').map((e) => e.json.status)).toEqual(['succeeded', 'oom']);
    expect(es.at(-1)).toMatchObject({ id: '2:end', event: 'end', json: { end_reason: 'oom' } });
    const after = await svc.post(`/sessions/${id}/execute`, { code: 'print(kept)' });
    expect(after.status).toBe(409);
    expect(((await after.json()) as J).detail).toContain('has ended (oom)');
  }, 120_000);
});
