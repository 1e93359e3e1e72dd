/**
 * Sessions over the API (issue 19) on the real local runtime and database: a session keeps state
 * across cells, each cell is an execution record (GET /jobs/{id}, relationship session, its own
 * artifacts, error classification); one cell at a time (409 with the running cell's id); a timed-out
 * cell keeps the state; max_sessions is a 503 that says so; closing ends the session; the sweep ends
 * idle and over-lifetime sessions on an injected clock; a graceful stop ends live sessions
 * `service_restart`; the escape probes hold inside a cell.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';
import { expectSessionFilesApi, type Send } from '../../support/session-files.ts';

const asRoot = process.getuid?.() === 0;

describe.skipIf(!asRoot)('sessions API', () => {
  let svc: TestService;
  let now = Date.now();
  let fake = false;
  beforeAll(async () => {
    svc = await startTestService({ max_sessions: 2, warm_pool: { sizes: {} } }, { now: () => (fake ? now : Date.now()) });
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  const json = async (res: Response) => (await res.json()) as Record<string, any>;
  const create = async (body: Record<string, unknown> = {}) => {
    const res = await svc.post('/sessions', body);
    const j = await json(res);
    expect(res.status, JSON.stringify(j)).toBe(201);
    return j;
  };
  const exec = async (id: string, body: Record<string, unknown>) => json(await svc.post(`/sessions/${id}/execute`, body));

  it('keeps state across cells; each cell is an execution record with its own artifacts', async () => {
    const s = await create({ idle_timeout: 600 });
    expect(s).toMatchObject({ status: 'ready', job_type: 'default', cells: 0, end_reason: null, idle_timeout: 600, max_lifetime: 3600 });
    const c1 = await exec(s.session_id, { code: 'rows = [1, 2, 3]\nopen("data.csv", "w").write("a\\n")\nprint("loaded")' });
    expect(c1).toMatchObject({ success: true, stdout: 'loaded\n', cell: 1, session_id: s.session_id });
    const c2 = await exec(s.session_id, {
      code: 'import json\nd = json.load(open("/input/data.json"))\njson.dump({"sum": sum(rows) + d["n"], "csv": open("data.csv").read()}, open("/output/result.json", "w"))\nopen("/output/plot.txt", "w").write("p")',
      input_data: { n: 10 },
    });
    expect(c2).toMatchObject({ success: true, output: { sum: 16, csv: 'a\n' }, cell: 2 });
    const rec = await json(await svc.get(`/jobs/${c2.execution_id}?view=full`));
    expect(rec).toMatchObject({ status: 'succeeded', relationship: 'session', session_id: s.session_id, cell: 2 });
    expect(rec.artifacts.map((a: any) => a.name)).toEqual(['plot.txt']);
    expect((await json(await svc.get(`/jobs/${c1.execution_id}?view=full`))).artifacts).toEqual([]);
    const c3 = await exec(s.session_id, { code: 'print(undefined_name)' });
    expect(c3).toMatchObject({ success: false, cell: 3, error: { type: 'name_error' } });
    const got = await json(await svc.get(`/sessions/${s.session_id}`));
    expect(got).toMatchObject({ status: 'ready', cells: 3 });
    const closed = await json(await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' }));
    expect(closed).toMatchObject({ status: 'ended', end_reason: 'closed', expires_at: null });
    const after = await svc.post(`/sessions/${s.session_id}/execute`, { code: 'print(1)' });
    expect(after.status).toBe(409);
    expect((await json(after)).detail).toContain('has ended (closed)');
  }, 120_000);

  it('one cell at a time: 409 with the running cell; a timed-out cell keeps the state', async () => {
    const s = await create();
    await exec(s.session_id, { code: 'x = 5' });
    const slow = svc.post(`/sessions/${s.session_id}/execute`, { code: 'import time\nwhile True: time.sleep(0.05)', timeout: 5 });
    let busy: Record<string, any> = {};
    for (let i = 0; i < 100; i++) {
      busy = await json(await svc.get(`/sessions/${s.session_id}`));
      if (busy.status === 'busy') break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(busy.status).toBe('busy');
    const second = await svc.post(`/sessions/${s.session_id}/execute`, { code: 'print(x)' });
    expect(second.status).toBe(409);
    expect((await json(second)).running_cell_id).toBe(busy.running_cell_id);
    const timedOut = await json(await slow);
    expect(timedOut).toMatchObject({ success: false, exit_code: null, error: { type: 'execution_timeout' } });
    expect((await json(await svc.get(`/jobs/${timedOut.execution_id}`))).status).toBe('timeout');
    expect(await exec(s.session_id, { code: 'print(x)' })).toMatchObject({ success: true, stdout: '5\n' });
    await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' });
  }, 120_000);

  it('a cell whose interpreter is killed (not by the memory limit) is `killed`, and the session ends crashed', async () => {
    const s = await create();
    await exec(s.session_id, { code: 'x = 1' });
    const killed = await exec(s.session_id, { code: 'import os, signal\nprint("going", flush=True)\nos.kill(os.getpid(), signal.SIGKILL)' });
    expect(killed).toMatchObject({ success: false, stdout: 'going\n', error: { type: 'killed' } });
    expect((await json(await svc.get(`/jobs/${killed.execution_id}`))).status).toBe('failed');
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'crashed' });
    expect((await svc.post(`/sessions/${s.session_id}/execute`, { code: 'print(x)' })).status).toBe(409);
  }, 120_000);

  it('a cell continues the request’s trace: trace_id on its record, TRACEPARENT in its environment for that cell only', async () => {
    const s = await create();
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    const tp = `00-${traceId}-00f067aa0ba902b7-01`;
    const code = 'import os\nprint(os.environ.get("TRACEPARENT", "none"))';
    const res = await svc.post(`/sessions/${s.session_id}/execute`, { code }, { traceparent: tp });
    const traced = await json(res);
    expect(res.status, JSON.stringify(traced)).toBe(200);
    // Tracing is off here (no OTLP endpoint): the request's traceparent itself is what the program sees.
    expect(traced.stdout).toBe(`${tp}\n`);
    const full = await json(await svc.get(`/jobs/${traced.execution_id}?view=full`));
    expect(full.trace_id).toBe(traceId);
    // The next cell, sent without one, does not inherit it.
    expect((await exec(s.session_id, { code })).stdout).toBe('none\n');
    await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' });
  });

  it('max_sessions: over it is a 503 that says so; bad settings are 400; unknown ids 404', async () => {
    const a = await create();
    const b = await create();
    const over = await svc.post('/sessions', {});
    expect(over.status).toBe(503);
    expect((await json(over)).detail).toMatch(/max_sessions 2/);
    expect((await svc.post('/sessions', { idle_timeout: 3601 })).status).toBe(400);
    expect((await svc.post('/sessions', { job_type: 'nope' })).status).toBe(400);
    expect((await svc.get('/sessions/nope')).status).toBe(404);
    expect((await svc.post('/sessions/nope/execute', { code: 'print(1)' })).status).toBe(404);
    const page = await json(await svc.get('/sessions?status=ready&limit=1'));
    expect(page).toMatchObject({ count: 1, limit: 1, offset: 0, has_more: true });
    for (const s of [a, b]) await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' });
  }, 120_000);

  it('the escape probes hold inside a cell', async () => {
    const s = await create();
    const probe = [
      // no_new_privs asked of the kernel (PR_GET_NO_NEW_PRIVS, 39): gVisor's /proc/self/status has no NoNewPrivs line.
      'import os, json, socket, ctypes',
      'def w(p):',
      '    try:',
      '        open(p, "w").write("x"); return "written"',
      '    except OSError as e: return type(e).__name__',
      'def net():',
      '    try:',
      '        socket.create_connection(("1.1.1.1", 53), timeout=2); return "connected"',
      '    except OSError as e: return type(e).__name__',
      'status = open("/proc/self/status").read()',
      'cap = [l for l in status.splitlines() if l.startswith("CapEff")][0].split()[1]',
      'print(json.dumps({"uid": os.getuid(), "code": w("/code/x"), "input": w("/input/x"), "root": w("/etc/x"), "net": net(), "cap": int(cap, 16), "nnp": ctypes.CDLL(None).prctl(39, 0, 0, 0, 0) == 1}))',
    ].join('\n');
    const r = await exec(s.session_id, { code: probe });
    expect(r.success, r.stderr).toBe(true);
    const p = JSON.parse(r.stdout);
    expect(p).toMatchObject({ uid: 1000, cap: 0, nnp: true });
    for (const k of ['code', 'input', 'root', 'net']) expect(p[k], k).not.toMatch(/written|connected/);
    await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' });
  }, 120_000);

  it('files API: put, get (ETag, 304, HEAD), list, delete in /workspace; traversal refused on every route; links, directories and FIFOs never followed', async () => {
    const s = await create();
    const send: Send = (method, p, body, headers) => Promise.resolve(svc.app.request(p, { method, ...(headers ? { headers } : {}), ...(body === undefined ? {} : { body }) }));
    await expectSessionFilesApi(send, s.session_id, (code) => exec(s.session_id, { code }), svc.config.max_artifact_bytes);
  }, 120_000);

  it('the sweep ends idle and over-lifetime sessions (injected clock)', async () => {
    const idle = await create({ idle_timeout: 60 });
    const life = await create({ idle_timeout: 3600, max_lifetime: 120 });
    now = Date.now();
    fake = true;
    try {
      now += 61_000;
      await exec(life.session_id, { code: 'print(1)' }); // used: not idle
      await svc.sessions!.sweep();
      expect(await json(await svc.get(`/sessions/${idle.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'idle' });
      expect((await json(await svc.get(`/sessions/${life.session_id}`))).status).toBe('ready');
      now += 60_000;
      await svc.sessions!.sweep();
      expect(await json(await svc.get(`/sessions/${life.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'lifetime' });
    } finally {
      fake = false;
    }
  }, 120_000);
});

describe.skipIf(!asRoot)('sessions and a restart', () => {
  it('a graceful stop ends live sessions service_restart; the next process sees them ended', async () => {
    const first = await startTestService({ warm_pool: { sizes: {} } });
    const s = (await (await first.post('/sessions', {})).json()) as Record<string, any>;
    expect(s.status).toBe('ready');
    await first.stop(2000);
    const second = await startTestService({ warm_pool: { sizes: {} } }, {}, first.database);
    try {
      expect(await (await second.get(`/sessions/${s.session_id}`)).json()).toMatchObject({ status: 'ended', end_reason: 'service_restart' });
    } finally {
      await second.close();
      await first.database.drop();
    }
  }, 120_000);
});
