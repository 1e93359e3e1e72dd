/**
 * `GET /jobs/{id}/events` served by a replica that does not hold the run (issue 12): two services on
 * one PostgreSQL database, A answers the stream, B (the only dispatcher) runs the program. Also a
 * slow reader: the server pages through the stored events at the reader's pace, so what it has read
 * ahead of the client stays small while the client does not read. PostgreSQL only for the replicas
 * (PGlite is one process's database); the slow reader runs on the database under test.
 */
import { mkdirSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, testDbKind, type TestDatabase } from '../../support/db.ts';
import { listen, startTestService, type TestService } from '../../support/service.ts';
import { allEvents, sseEvents, textOf, type SseEvent } from '../../support/sse.ts';

const kind = await testDbKind();
type J = Record<string, any>;

describe.skipIf(kind !== 'postgres')('events across replicas', () => {
  let database: TestDatabase;
  let a: TestService;
  let b: TestService;
  beforeAll(async () => {
    database = await freshDatabase();
    const on = (name: string): TestDatabase => {
      const workspace = path.join(database.workspace, name);
      mkdirSync(workspace, { recursive: true, mode: 0o755 });
      return { ...database, workspace, drop: async () => {} };
    };
    // One process holds both: A's orphan sweep would take B's run for its own previous life (same pid).
    a = await startTestService({ dispatch: false }, { heartbeatMs: 120_000 }, on('a'));
    b = await startTestService({}, {}, on('b'));
  });
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await database?.drop();
  });

  it('A streams the output of a run B holds, live, and resumes after Last-Event-ID', async () => {
    const res = await a.post('/execute/async', { code: 'import time\nprint("one", flush=True)\ntime.sleep(1.5)\nprint("two")' });
    const id = ((await res.json()) as J).job_id as string;
    const seen: SseEvent[] = [];
    let statusAtFirst: string | null = null;
    const stream = sseEvents(await a.get(`/jobs/${id}/events`));
    for await (const e of stream) {
      seen.push(e);
      if (e.event === 'stdout' && statusAtFirst === null) {
        const r = await a.db.kysely.selectFrom('executions').select(['status', 'claimed_by']).where('id', '=', id).executeTakeFirstOrThrow();
        statusAtFirst = r.status;
        expect(r.claimed_by).toBe(b.executions.workerId);
      }
      // Stop after the first chunk: the rest comes by resuming.
      if (e.event === 'stdout') break;
    }
    expect(statusAtFirst).toBe('running');
    const rest = await allEvents(await a.get(`/jobs/${id}/events`, { 'Last-Event-ID': seen.at(-1)!.id! }));
    const all = [...seen, ...rest];
    expect(textOf(all, 'stdout')).toBe('one\ntwo\n');
    expect(all.at(-1)).toMatchObject({ event: 'end' });
    expect(all.at(-1)!.json).toMatchObject({ status: 'succeeded', stdout: 'one\ntwo\n' });
    // The same ids from either replica.
    const fromA = await allEvents(await a.get(`/jobs/${id}/events`));
    const fromB = await allEvents(await b.get(`/jobs/${id}/events`));
    expect(fromA.map((e) => [e.id, e.event, e.data])).toEqual(fromB.map((e) => [e.id, e.event, e.data]));
    expect(fromA.map((e) => e.id)).toEqual(all.map((e) => e.id));
  });
});

describe('a slow reader', () => {
  let svc: TestService;
  let server: http.Server;
  const total = 16 * 1024 * 1024;
  beforeAll(async () => {
    svc = await startTestService({ max_stdout_bytes: total });
    server = (await listen(svc, 0, '127.0.0.1')) as http.Server;
  });
  afterAll(async () => {
    await new Promise((r) => server?.close(r));
    await svc?.close();
  });

  it('the server reads no further ahead of a reader that stops than the sockets hold; all arrives once it reads', async () => {
    const res = await svc.post('/execute/async', { code: `import sys\nfor i in range(${total / 1024}):\n    sys.stdout.write(("%08d" % i) + "x" * 1016)\n` });
    const id = ((await res.json()) as J).job_id as string;
    const rec = (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=60`)).json()) as J;
    expect(rec.status).toBe('succeeded');
    expect(rec.stdout.length).toBe(total);
    // A client that sends its request and then reads nothing.
    const port = (server.address() as AddressInfo).port;
    const sock = net.connect(port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    sock.pause();
    const before = svc.events.dataBytesRead;
    sock.write(`GET /jobs/${id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
    // Until the server has started and then stopped reading ahead (its writes wait for the reader).
    for (let i = 0; i < 200 && svc.events.dataBytesRead === before; i++) await new Promise((r) => setTimeout(r, 50));
    let last = -1;
    for (let i = 0; i < 40 && svc.events.dataBytesRead !== last; i++) {
      last = svc.events.dataBytesRead;
      await new Promise((r) => setTimeout(r, 500));
    }
    const aheadWhilePaused = svc.events.dataBytesRead - before;
    expect(aheadWhilePaused).toBeGreaterThan(0);
    // Socket buffers (a few MB on loopback) and one page, not the stream (16 MB of output).
    expect(aheadWhilePaused).toBeLessThan(total / 2);
    // Now read, slowly at first.
    const chunks: Buffer[] = [];
    let n = 0;
    sock.on('data', (c: Buffer) => {
      chunks.push(c);
      if (++n < 50) {
        sock.pause();
        setTimeout(() => sock.resume(), 5);
      }
    });
    const ended = new Promise((r) => sock.once('end', r));
    sock.resume();
    await ended;
    sock.destroy();
    const raw = Buffer.concat(chunks).toString('utf8');
    const body = raw.slice(raw.indexOf('\r\n\r\n') + 4);
    // Chunked transfer encoding: the SSE text is inside the chunks; parse the data lines of stdout events.
    const sse = dechunk(body);
    const stdout = sse
      .split('\n\n')
      .filter((blk) => blk.startsWith('event: stdout'))
      .map((blk) => JSON.parse(blk.split('\n').find((l) => l.startsWith('data: '))!.slice(6)).data as string)
      .join('');
    expect(stdout.length).toBe(total);
    expect(stdout).toBe(rec.stdout);
    expect(sse).toContain('event: end');
  });
});

/** The body of a chunked HTTP/1.1 response. */
function dechunk(s: string): string {
  const buf = Buffer.from(s, 'utf8');
  const out: Buffer[] = [];
  let i = 0;
  for (;;) {
    const nl = buf.indexOf('\r\n', i);
    if (nl < 0) break;
    const size = parseInt(buf.subarray(i, nl).toString('latin1'), 16);
    if (!size) break;
    out.push(buf.subarray(nl + 2, nl + 2 + size));
    i = nl + 2 + size + 2;
  }
  return Buffer.concat(out).toString('utf8');
}
