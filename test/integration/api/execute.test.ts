/**
 * POST /execute end to end: real HTTP app, real database, real sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';

let svc: TestService;
beforeAll(async () => {
  svc = await startTestService({ max_timeout: 20, default_timeout: 20 });
});
afterAll(async () => {
  await svc?.close();
});

async function run(body: Record<string, unknown>) {
  const res = await svc.post('/execute', body);
  return { status: res.status, body: (await res.json()) as Record<string, any>, headers: res.headers };
}

describe('POST /execute', () => {
  it('print(1) → success, stdout "1\\n", SPEC §2.2 fields', async () => {
    const r = await run({ code: 'print(1)' });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ success: true, stdout: '1\n', stderr: '', exit_code: 0, error: null, output: null, job_type: 'default' });
    expect(typeof r.body.execution_time).toBe('number');
    expect(r.body).not.toHaveProperty('timing');
    expect(r.headers.get('x-content-type-options')).toBe('nosniff');
    expect(r.headers.get('x-frame-options')).toBe('DENY');
    expect(r.headers.get('x-correlation-id')).toBeTruthy();
  });

  it('reads input_data and returns result.json as output', async () => {
    const code = 'import json\nd=json.load(open("/input/data.json"))\njson.dump({"sum": d["a"]+d["b"]}, open("/output/result.json","w"))';
    const r = await run({ code, input_data: { a: 2, b: 40 } });
    expect(r.body).toMatchObject({ success: true, output: { sum: 42 } });
  });

  it('an exception → traceback in stderr, exit 1, typed error (SPEC §7.3 rule 1)', async () => {
    const r = await run({ code: 'x = {}\nx["missing"]' });
    expect(r.status).toBe(200);
    expect(r.body.success).toBe(false);
    expect(r.body.exit_code).toBe(1);
    expect(r.body.stderr).toContain('Traceback (most recent call last)');
    expect(r.body.stderr).toContain("KeyError: 'missing'");
    expect(r.body.error).toMatchObject({ type: 'key_error' });
  });

  it('a missing module → import_error naming it (rule 8)', async () => {
    const r = await run({ code: 'import numpy_not_here' });
    expect(r.body.error.type).toBe('import_error');
    expect(r.body.stderr).toContain('numpy_not_here');
    expect(r.body.error.message).toContain('numpy_not_here');
  });

  it('syntax errors are syntax_error', async () => {
    const r = await run({ code: 'def f(:\n  pass' });
    expect(r.body.error.type).toBe('syntax_error');
    expect(r.body.stderr).toContain('SyntaxError');
  });

  it('sys.exit(3) → runtime_error with exit code 3', async () => {
    const r = await run({ code: 'import sys; sys.exit(3)' });
    expect(r.body).toMatchObject({ success: false, exit_code: 3, error: { type: 'runtime_error' } });
  });

  it('an execution timeout → execution_timeout, exit_code null (rule 3)', async () => {
    const r = await run({ code: 'while True: pass', timeout: 1 });
    expect(r.body).toMatchObject({ success: false, exit_code: null, error: { type: 'execution_timeout', phase: 'execution' } });
    const rec = await (await svc.get(`/executions/${r.body.execution_id}?view=full`)).json();
    expect(rec).toMatchObject({ status: 'timeout', exit_code: null, timing: { phase_at_exit: 'execution' } });
  });

  it('records every sync run with the full record (SPEC §2.3)', async () => {
    const r = await run({ code: 'print("hi")', input_data: { k: 'v' } });
    const res = await svc.get(`/executions/${r.body.execution_id}?view=full`);
    expect(res.status).toBe(200);
    const rec = (await res.json()) as Record<string, any>;
    expect(rec).toMatchObject({
      execution_id: r.body.execution_id,
      status: 'succeeded',
      job_type: 'default',
      job_version: 'latest',
      exit_code: 0,
      stdout: 'hi\n',
      error: null,
      parent_execution_id: null,
      relationship: null,
      stdout_truncated: false,
      stderr_truncated: false,
    });
    expect(rec.job_ref).toMatch(/^default@sha256:[0-9a-f]{64}$/);
    expect(rec.code_hash).toMatch(/^[0-9a-f]{64}$/);
    expect(rec.input_hash).toMatch(/^[0-9a-f]{64}$/);
    for (const k of ['created_at', 'started_at', 'ended_at']) expect(rec[k]).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(rec.duration_ms).toBeGreaterThanOrEqual(0);
    expect(Object.keys(rec.timing).sort()).toEqual(['dep_install_ms', 'execution_ms', 'phase_at_exit', 'startup_ms', 'total_ms']);
    expect(rec.timing.phase_at_exit).toBe('completed');
    expect(Object.keys(rec.resource_usage).sort()).toEqual(['cpu_time_ms', 'max_rss_mb', 'wall_time_ms']);
    expect(rec.resource_usage.max_rss_mb).toBeGreaterThan(0);
    expect(rec.input_artifacts.map((a: { name: string }) => a.name).sort()).toEqual(['_code.py', '_input.json']);
    // Without view=full the extended fields are absent.
    const brief = (await (await svc.get(`/executions/${r.body.execution_id}`)).json()) as Record<string, unknown>;
    expect(brief).not.toHaveProperty('job_ref');
    expect(brief).not.toHaveProperty('code_hash');
  });

  it('caps stdout at max_stdout_bytes and says so', async () => {
    const r = await run({ code: 'print("x" * 100000)' });
    expect(r.body.stdout.length).toBeLessThanOrEqual(32768);
    const rec = (await (await svc.get(`/executions/${r.body.execution_id}?view=full`)).json()) as Record<string, any>;
    expect(rec.stdout_truncated).toBe(true);
  });

  it('does not show the service environment to the code', async () => {
    process.env.SANDPOD_CANARY = 'do-not-leak';
    const r = await run({ code: 'import os\nprint(sorted(os.environ))\nprint(open("/proc/self/environ","rb").read())' });
    expect(r.body.success).toBe(true);
    expect(r.body.stdout).not.toContain('do-not-leak');
    expect(r.body.stdout).not.toContain('SVC_DATABASE_URL');
  });
});

describe('POST /execute validation (400 with a detail naming the problem)', () => {
  it.each<[Record<string, unknown>, string]>([
    [{}, 'code'],
    [{ code: '' }, 'code'],
    [{ code: '   ' }, 'non-empty'],
    [{ code: 42 }, 'code'],
    [{ code: 'print(1)', timeout: 0 }, 'timeout'],
    [{ code: 'print(1)', timeout: 21 }, 'timeout'],
    [{ code: 'print(1)', timeout: 1.5 }, 'timeout'],
    [{ code: 'print(1)', timeout: '5' }, 'timeout'],
    [{ code: 'print(1)', startup_timeout: 5 }, 'startup_timeout'],
    [{ code: 'print(1)', startup_timeout: 601 }, 'startup_timeout'],
    [{ code: 'print(1)', job_type: 'nope' }, 'unknown job type'],
    [{ code: 'print(1)', input_data: [1, 2] }, 'input_data'],
    [{ code: 'print(1)', input_data: 'x' }, 'input_data'],
    [{ code: 'print(1)', requirements: 'requests' }, 'requirements'],
    [{ code: 'print(1)', requirements: ['-r /etc/passwd'] }, 'requirements'],
    [{ code: 'print(1)', requirements: ['--index-url=http://evil'] }, 'requirements'],
    [{ code: 'print(1)', requirements: ['git+https://x/y.git'] }, 'requirements'],
    [{ code: 'print(1)', idempotency_key: 'k' }, 'idempotency_key'],
    [{ code: 'x'.repeat(100 * 1024 + 1) }, 'code must be at most'],
    [{ code: 'print(1)', input_data: { big: 'x'.repeat(1024 * 1024) } }, 'input_data must be at most'],
  ])('case %# → 400 mentioning $1', async (body, needle) => {
    const res = await svc.post('/execute', body);
    expect(res.status).toBe(400);
    const b = (await res.json()) as Record<string, string>;
    expect(b.detail).toContain(needle);
    expect(b.code).toBe('validation_error');
    expect(b.correlation_id).toBeTruthy();
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
  });

  it('malformed JSON → 400', async () => {
    const res = await svc.post('/execute', '{"code": ');
    expect(res.status).toBe(400);
    expect(((await res.json()) as { detail: string }).detail).toContain('not valid JSON');
  });

  it('a JSON array body → 400', async () => {
    expect((await svc.post('/execute', '[1,2]')).status).toBe(400);
  });

  it('non-JSON content type → 415', async () => {
    const res = await svc.app.request('/execute', { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'print(1)' });
    expect(res.status).toBe(415);
  });

  it('an oversized body → 413', async () => {
    const res = await svc.post('/execute', { code: 'x'.repeat(3 * 1024 * 1024) });
    expect(res.status).toBe(413);
  });

  it('unknown routes → JSON 404 with the security headers and the caller\'s correlation id', async () => {
    const res = await svc.get('/nope', { 'x-correlation-id': 'abc-123' });
    expect(res.status).toBe(404);
    expect(res.headers.get('x-correlation-id')).toBe('abc-123');
    expect(res.headers.get('x-frame-options')).toBe('DENY');
    expect(await res.json()).toMatchObject({ code: 'not_found', correlation_id: 'abc-123' });
  });
});

describe('job types and health', () => {
  it('GET /job-types lists the built-ins; unknown → 404', async () => {
    const list = (await (await svc.get('/job-types')).json()) as { name: string; image_exists: boolean }[];
    expect(list.map((j) => j.name)).toEqual(['data', 'default', 'http']);
    const d = (await (await svc.get('/job-types/default')).json()) as Record<string, unknown>;
    expect(d).toMatchObject({ name: 'default', requirements: [], python_version: '3.11', memory_limit: '512m', cpu_limit: 1, timeout: 20, image_exists: false });
    expect((await svc.get('/job-types/nope')).status).toBe(404);
  });

  it('GET /health has every SPEC §2.10 field plus the sandbox engine', async () => {
    const res = await svc.get('/health');
    const h = (await res.json()) as Record<string, any>;
    expect(res.status).toBe(200);
    expect(h).toMatchObject({
      status: 'healthy',
      docker_available: true,
      circuit_breaker: { state: 'closed', failure_count: 0, last_failure: null },
      production_mode: false,
      queue_stats: { max_workers: 2, max_queue_size: 100 },
      sandbox: { engine: 'bubblewrap', isolated: true },
    });
    expect(typeof h.gvisor_available).toBe('boolean');
    expect(h.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(typeof h.circuit_breaker.success_count).toBe('number');
    expect(['cgroups', 'rlimits']).toContain(h.sandbox.limits);
  });
});

describe('over a real socket', () => {
  let base: string;
  let close: () => Promise<void>;
  beforeAll(async () => {
    const { listen } = await import('../../support/service.ts');
    const server = await listen(svc, 0, '127.0.0.1');
    const addr = server.address();
    base = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
    close = () => new Promise((r) => server.close(() => r()));
  });
  afterAll(async () => {
    await close?.();
  });

  it('runs code and answers with the headers', async () => {
    const res = await fetch(`${base}/execute`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ code: 'print(6*7)' }) });
    expect(res.status).toBe(200);
    expect(((await res.json()) as Record<string, unknown>).stdout).toBe('42\n');
    expect(res.headers.get('x-frame-options')).toBe('DENY');
  });

  it('reads request headers from the socket: correlation id, client IP, JSON content types, If-None-Match', async () => {
    const post = (body: unknown, headers: Record<string, string>) => fetch(`${base}/execute/async`, { method: 'POST', headers, body: JSON.stringify(body) });
    const res = await post({ code: 'open("/output/a.txt","w").write("a")' }, { 'content-type': 'application/json; charset=utf-8', 'x-correlation-id': 'sock-1', 'x-forwarded-for': '203.0.113.7, 10.0.0.1' });
    expect(res.status).toBe(202);
    expect(res.headers.get('x-correlation-id')).toBe('sock-1');
    const id = ((await res.json()) as { job_id: string }).job_id;
    const rec = (await (await fetch(`${base}/jobs/${id}/result?wait=true&timeout=30&view=full`)).json()) as Record<string, unknown>;
    expect(rec.correlation_id).toBe('sock-1');
    const client = await svc.db.kysely.selectFrom('executions').select('client_ip').where('id', '=', id).executeTakeFirstOrThrow();
    expect(client.client_ip).toBe('203.0.113.7');
    expect((await post({ code: 'print(1)' }, { 'content-type': 'text/plain' })).status).toBe(415);
    expect((await post({ code: 'print(1)' }, { 'content-type': 'application/vnd.api+json' })).status).toBe(202);
    const art = await fetch(`${base}/jobs/${id}/artifacts/a.txt`);
    const etag = art.headers.get('etag')!;
    expect((await fetch(`${base}/jobs/${id}/artifacts/a.txt`, { headers: { 'if-none-match': `"nope", ${etag}` } })).status).toBe(304);
    expect((await fetch(`${base}/jobs/${id}/artifacts/a.txt`, { headers: { 'if-none-match': '"nope"' } })).status).toBe(200);
  });

  it('refuses an oversized body from its Content-Length (413) and a chunked one while reading', async () => {
    const big = JSON.stringify({ code: 'x'.repeat(3 * 1024 * 1024) });
    const res = await fetch(`${base}/execute`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: big });
    expect(res.status).toBe(413);
    expect(((await res.json()) as Record<string, string>).code).toBe('payload_too_large');
    const chunked = new ReadableStream({
      start(ctl) {
        for (let i = 0; i < 3; i++) ctl.enqueue(new TextEncoder().encode('x'.repeat(1024 * 1024)));
        ctl.close();
      },
    });
    const res2 = await fetch(`${base}/execute/async`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chunked, duplex: 'half' } as RequestInit);
    expect(res2.status).toBe(413);
  });
});
