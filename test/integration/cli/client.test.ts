/**
 * The typed client (src/client) against the running app on a real listening port, real database and
 * real sandbox: submission, result, error bodies as SandpodError, artifacts, bearer tokens, an
 * unreachable service. `events()` is checked against a small SSE server that follows the event
 * stream contract (docs/api.md): typed events in order, unknown events and keep-alive comments
 * skipped, a dropped connection resumed with Last-Event-ID, a 404 error body thrown.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSandpodClient, SandpodConnectionError, SandpodError, unwrap, type ErrorBody, type ExecutionRecordFull, type SandpodEvent } from '../../../src/client/index.ts';
import { useServedService } from '../../support/service.ts';
// The package's own export (package.json `exports`): the same client, by the package name.
import type { SandpodClient as ExportedClient } from 'sandpod';

const TOKEN = 'client-test-token-0123456789';


describe('the client against the running app', () => {
  const served = useServedService();

  it('submits, waits for the result and reads the typed record', async () => {
    const client: ExportedClient = createSandpodClient({ baseUrl: served.url });
    const code = 'import json\nd = json.load(open("/input/data.json"))\nprint("n is", d["n"])\njson.dump({"twice": d["n"] * 2}, open("/output/result.json", "w"))\nopen("/output/a.txt", "w").write("artifact")\n';
    const job = unwrap(await client.POST('/execute/async', { body: { code, input_data: { n: 21 } } }));
    expect(job.status).toBe('pending');
    expect(job.job_id).toMatch(/^[0-9a-f-]{36}$/);
    const record = unwrap(
      await client.GET('/jobs/{id}/result', { params: { path: { id: job.job_id }, query: { wait: 'true', timeout: 60, view: 'full' } } }),
    ) as ExecutionRecordFull;
    expect(record.status).toBe('succeeded');
    expect(record.stdout).toBe('n is 21\n');
    expect(record.output).toEqual({ twice: 42 });
    const art = record.artifacts.find((a) => a.name === 'a.txt');
    expect(art?.size_bytes).toBe(8);
    const bytes = unwrap(await client.GET('/jobs/{id}/artifacts/{name}', { params: { path: { id: job.job_id, name: 'a.txt' } }, parseAs: 'text' }));
    expect(bytes).toBe('artifact');
  });

  it('throws SandpodError with the error body: 404 unknown job, 400 naming the field', async () => {
    const client = createSandpodClient({ baseUrl: `${served.url}/` });
    const missing = await client.GET('/jobs/{id}', { params: { path: { id: '00000000-0000-4000-8000-000000000000' } } });
    const e404 = (() => {
      try {
        unwrap(missing);
      } catch (err) {
        return err;
      }
    })();
    expect(e404).toBeInstanceOf(SandpodError);
    expect((e404 as SandpodError).status).toBe(404);
    expect((e404 as SandpodError).code).toBe('not_found');
    expect((e404 as SandpodError).correlationId).toBe(missing.response.headers.get('x-correlation-id'));

    const bad = await client.POST('/execute/async', { body: { code: 'print(1)', timeout: 100_000 } });
    expect(bad.response.status).toBe(400);
    expect(() => unwrap(bad)).toThrow(SandpodError);
    expect(bad.error?.code).toBe('validation_error');
    expect(bad.error?.detail).toMatch(/timeout/);
  });

  it('events(): the stream of a job, or a 404 error body for an unknown job', async () => {
    const client = createSandpodClient({ baseUrl: served.url });
    const job = unwrap(await client.POST('/execute/async', { body: { code: 'print("streamed")' } }));
    let err: unknown;
    const seen: SandpodEvent[] = [];
    try {
      for await (const ev of client.events(job.job_id)) seen.push(ev);
    } catch (e) {
      err = e;
    }
    if (err !== undefined) {
      // A service without the event stream (before issue 12 point 1 lands) answers the route's 404.
      expect(err).toBeInstanceOf(SandpodError);
      expect((err as SandpodError).status).toBe(404);
      expect((err as SandpodError).detail).toMatch(/^no route/);
      return;
    }
    expect(seen.at(-1)?.event).toBe('end');
    expect(seen.filter((e) => e.event === 'stdout').map((e) => (e.data as { data: string }).data).join('')).toBe('streamed\n');
    const end = seen.at(-1)!;
    expect(end.event === 'end' && end.data).toMatchObject({ job_id: job.job_id, status: 'succeeded', exit_code: 0, stdout: 'streamed\n' });
    expect(seen[0]?.event).toBe('status');
    const ids = seen.map((e) => Number(e.id));
    expect(ids.every((id, i) => Number.isInteger(id) && (i === 0 || id > ids[i - 1]!))).toBe(true);
    // Resumed after the first event: only later events, ending with the record again.
    const resumed: SandpodEvent[] = [];
    for await (const ev of client.events(job.job_id, { lastEventId: seen[0]!.id })) resumed.push(ev);
    expect(resumed.at(-1)?.event).toBe('end');
    expect(resumed.every((e) => Number(e.id) > ids[0]!)).toBe(true);
    await expect(async () => {
      for await (const _ of client.events('00000000-0000-4000-8000-000000000000')) void _;
    }).rejects.toMatchObject({ status: 404, code: 'not_found' });
  });
});

describe('bearer tokens', () => {
  const served = useServedService({ sandbox_engine: 'process', auth: { tokens: [TOKEN] } });

  it('401 unauthorized without the token, 200 with it', async () => {
    const anon = await createSandpodClient({ baseUrl: served.url }).GET('/job-types');
    expect(anon.response.status).toBe(401);
    // The document lists no 401 per operation (auth is optional, declared once as a security scheme).
    expect((anon.error as ErrorBody | undefined)?.code).toBe('unauthorized');
    const wrong = await createSandpodClient({ baseUrl: served.url, token: 'not-the-token-at-all' }).GET('/job-types');
    expect(wrong.response.status).toBe(401);
    const types = unwrap(await createSandpodClient({ baseUrl: served.url, token: TOKEN }).GET('/job-types'));
    expect(types.map((t) => t.name)).toContain('default');
  });
});

describe('an unreachable service', () => {
  it('is a SandpodConnectionError naming the address and the reason', async () => {
    // A port that was just free: nothing listens there.
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', () => r()));
    const { port } = probe.address() as AddressInfo;
    await new Promise((r) => probe.close(r));
    const client = createSandpodClient({ baseUrl: `http://127.0.0.1:${port}` });
    const err = await client.GET('/health').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SandpodConnectionError);
    expect((err as Error).message).toContain(`127.0.0.1:${port}`);
    expect((err as Error).message).toMatch(/ECONNREFUSED/);
    const viaEvents = await (async () => {
      for await (const _ of client.events('x')) void _;
    })().catch((e: unknown) => e);
    expect(viaEvents).toBeInstanceOf(SandpodConnectionError);
  });
});

/**
 * A server that speaks the event-stream contract for one job id: a keep-alive comment, status
 * events, output chunks, an event of a name clients do not know, and — on the first connection — a
 * drop before `end`; a reconnection must carry Last-Event-ID and gets the rest.
 */
function contractServer(): Promise<{ url: string; lastEventIds: (string | undefined)[]; close: () => Promise<void> }> {
  const lastEventIds: (string | undefined)[] = [];
  const record = { job_id: 'j1', execution_id: 'j1', status: 'succeeded', exit_code: 0, stdout: 'a\nb\n', stderr: 'warn\n' };
  const events = [
    ['status', { status: 'queued', phase: 'queued', at: '2026-01-01T00:00:00.000Z' }],
    ['status', { status: 'running', phase: 'installing', at: '2026-01-01T00:00:00.100Z' }],
    ['status', { status: 'running', phase: 'running', at: '2026-01-01T00:00:01.000Z' }],
    ['stdout', { data: 'a\n' }],
    ['stderr', { data: 'warn\n' }],
    ['future-event', { anything: true }],
    ['stdout', { data: 'b\n' }],
    ['artifact', { name: 'x.txt', size_bytes: 1, sha256: 'ab', content_type: 'text/plain' }],
    ['end', record],
  ] as const;
  const server: Server = createServer((req, res) => {
    const m = /^\/prefix\/jobs\/([^/]+)\/events$/.exec(req.url ?? '');
    if (!m || m[1] !== 'j1') {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ detail: `job '${m?.[1]}' not found`, code: 'not_found', correlation_id: 'c-1' }));
      return;
    }
    const last = req.headers['last-event-id'] as string | undefined;
    lastEventIds.push(last);
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store' });
    let text = ': ping\n\n';
    const from = last === undefined ? 0 : Number(last);
    events.forEach(([name, data], i) => {
      const id = i + 1;
      if (id <= from) return;
      if (last === undefined && id > 4) return; // the first connection drops after event 4
      text += `id: ${id}\nevent: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
    });
    if (last === undefined) res.write(text, () => res.destroy());
    else res.end(text);
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      resolve({ url: `http://127.0.0.1:${port}/prefix`, lastEventIds, close: () => new Promise((r) => server.close(() => r())) });
    });
  });
}

describe('events() against the contract', () => {
  let srv: Awaited<ReturnType<typeof contractServer>>;
  beforeAll(async () => {
    srv = await contractServer();
  });
  afterAll(async () => {
    await srv?.close();
  });

  it('yields the known events in order, skips the rest, resumes after a drop with Last-Event-ID', async () => {
    const client = createSandpodClient({ baseUrl: srv.url });
    const seen: SandpodEvent[] = [];
    for await (const ev of client.events('j1', { retryDelayMs: 10 })) seen.push(ev);
    expect(seen.map((e) => `${e.id}:${e.event}`)).toEqual(['1:status', '2:status', '3:status', '4:stdout', '5:stderr', '7:stdout', '8:artifact', '9:end']);
    expect(srv.lastEventIds).toEqual([undefined, '4']);
    const end = seen.at(-1)!;
    expect(end.event === 'end' && end.data.exit_code).toBe(0);
    const phases = seen.flatMap((e) => (e.event === 'status' ? [e.data.phase] : []));
    expect(phases).toEqual(['queued', 'installing', 'running']);
  });

  it('starts after lastEventId when given, and stops when the caller breaks out', async () => {
    const client = createSandpodClient({ baseUrl: srv.url });
    const seen: string[] = [];
    for await (const ev of client.events('j1', { lastEventId: '6' })) {
      seen.push(`${ev.id}:${ev.event}`);
      if (ev.event === 'artifact') break;
    }
    expect(seen).toEqual(['7:stdout', '8:artifact']);
  });

  it('throws the error body of a 404', async () => {
    const client = createSandpodClient({ baseUrl: srv.url });
    const err = await (async () => {
      for await (const _ of client.events('nope')) void _;
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SandpodError);
    expect(err).toMatchObject({ status: 404, code: 'not_found', detail: "job 'nope' not found", correlationId: 'c-1' });
  });
});
