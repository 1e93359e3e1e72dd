/**
 * Async jobs end to end (SPEC §3, §4.2–§4.8, §4.12): real HTTP app, real database, real sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';

let svc: TestService;
beforeAll(async () => {
  svc = await startTestService({ max_artifact_bytes: 4096, max_queue_size: 1000 });
});
afterAll(async () => {
  await svc?.close();
});

type J = Record<string, any>;
const json = async (res: Response | Promise<Response>) => (await (await res).json()) as J;

async function submit(body: J, headers: Record<string, string> = {}) {
  const res = await svc.post('/execute/async', body, headers);
  return { status: res.status, body: (await res.json()) as J };
}
async function result(id: string, q = 'wait=true&timeout=30') {
  const res = await svc.get(`/jobs/${id}/result?${q}`);
  return { status: res.status, body: (await res.json()) as J };
}

describe('submission and results', () => {
  it('returns job_id and status pending at once, then the record', async () => {
    const s = await submit({ code: 'print(2+2)' });
    expect(s.status).toBe(202);
    expect(s.body.status).toBe('pending');
    expect(s.body.job_id).toMatch(/^[0-9a-f-]{36}$/);
    const r = await result(s.body.job_id);
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ execution_id: s.body.job_id, status: 'succeeded', stdout: '4\n', exit_code: 0 });
    const st = await json(svc.get(`/jobs/${s.body.job_id}`));
    expect(st).toMatchObject({ job_id: s.body.job_id, status: 'succeeded' });
    expect(st.created_at).toMatch(/Z$/);
    expect(st.started_at).toMatch(/Z$/);
  });

  it('wait=true is woken by completion, not by its timeout', async () => {
    const s = await submit({ code: 'import time; time.sleep(0.5); print("done")' });
    const t0 = Date.now();
    const r = await result(s.body.job_id, 'wait=true&timeout=60');
    expect(r.body.status).toBe('succeeded');
    expect(Date.now() - t0).toBeLessThan(20_000);
  });

  it('wait runs out → 408 naming the job', async () => {
    const s = await submit({ code: 'import time; time.sleep(4)' });
    const r = await result(s.body.job_id, 'wait=true&timeout=1');
    expect(r.status).toBe(408);
    expect(r.body).toMatchObject({ code: 'wait_timeout', job_id: s.body.job_id });
    expect(['pending', 'running']).toContain(r.body.status);
  });

  it('wait=false on an unfinished job → 202 with message and queue_position', async () => {
    const s = await submit({ code: 'import time; time.sleep(2)' });
    const r = await result(s.body.job_id, 'wait=false');
    expect(r.status).toBe(202);
    expect(r.body.job_id).toBe(s.body.job_id);
    expect(['pending', 'running']).toContain(r.body.status);
    expect(typeof r.body.message).toBe('string');
    expect(Number.isInteger(r.body.queue_position)).toBe(true);
  });

  it('bad query values → 400; unknown job → 404', async () => {
    const s = await submit({ code: 'print(1)' });
    expect((await svc.get(`/jobs/${s.body.job_id}/result?wait=maybe`)).status).toBe(400);
    expect((await svc.get(`/jobs/${s.body.job_id}/result?timeout=0`)).status).toBe(400);
    expect((await svc.get(`/jobs/${s.body.job_id}?view=everything`)).status).toBe(400);
    expect((await svc.get('/jobs/no-such-job/result')).status).toBe(404);
    expect((await svc.get('/jobs/no-such-job')).status).toBe(404);
  });
});

describe('idempotency (SPEC §4.2 rules 1-4)', () => {
  it('same key + same payload → the same job, no second run', async () => {
    const body = { code: 'print("once")', idempotency_key: `k-${Date.now()}` };
    const a = await submit(body);
    const b = await submit({ ...body, timeout: 30, job_type: 'default', input_data: {} }); // defaults spelled out = same payload
    expect(b.status).toBe(200);
    expect(b.body.job_id).toBe(a.body.job_id);
    expect(b.body.created).toBe(false);
    await result(a.body.job_id);
    const c = await submit(body);
    expect(c.body).toMatchObject({ job_id: a.body.job_id, status: 'succeeded' });
    const n = await svc.db.kysely.selectFrom('executions').select(({ fn }) => fn.countAll<number>().as('n')).where('idempotency_key', '=', body.idempotency_key).executeTakeFirstOrThrow();
    expect(Number(n.n)).toBe(1);
  });

  it('same key + different payload → 409 with existing_job_id', async () => {
    const key = `k2-${Date.now()}`;
    const a = await submit({ code: 'print(1)', idempotency_key: key });
    const b = await submit({ code: 'print(2)', idempotency_key: key });
    expect(b.status).toBe(409);
    expect(b.body.existing_job_id).toBe(a.body.job_id);
    expect(b.body.detail).toContain(key);
  });

  it('no key → a new job every time', async () => {
    const a = await submit({ code: 'print(1)' });
    const b = await submit({ code: 'print(1)' });
    expect(a.body.job_id).not.toBe(b.body.job_id);
  });

  it('25 parallel submissions with one key create exactly one job', async () => {
    const key = `par-${Date.now()}`;
    const all = await Promise.all(Array.from({ length: 25 }, () => submit({ code: 'print("p")', idempotency_key: key })));
    expect(new Set(all.map((r) => r.body.job_id)).size).toBe(1);
    expect(all.every((r) => r.status === 200 || r.status === 202)).toBe(true);
    expect(all.filter((r) => r.body.created).length).toBe(1);
    const rows = await svc.db.kysely.selectFrom('executions').select('id').where('idempotency_key', '=', key).execute();
    expect(rows).toHaveLength(1);
  });
});

describe('cancel (SPEC §4.5)', () => {
  it('cancels a running job promptly and kills it', async () => {
    const s = await submit({ code: 'import time\nprint("started", flush=True)\ntime.sleep(60)', timeout: 90 });
    // wait until it runs
    for (let i = 0; i < 100; i++) {
      const st = await json(svc.get(`/jobs/${s.body.job_id}`));
      if (st.status === 'running') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const t0 = Date.now();
    const res = await svc.post(`/jobs/${s.body.job_id}/cancel`);
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ job_id: s.body.job_id, status: 'cancelled', previous_status: 'running' });
    expect(Date.now() - t0).toBeLessThan(10_000);
    const rec = await json(svc.get(`/executions/${s.body.job_id}`));
    expect(rec.status).toBe('cancelled');
    expect(rec.error.type).toBe('cancelled');
    // cancelling again is idempotent; a finished job cannot be cancelled
    expect((await svc.post(`/jobs/${s.body.job_id}/cancel`)).status).toBe(200);
    const done = await submit({ code: 'print(1)' });
    await result(done.body.job_id);
    const late = await svc.post(`/jobs/${done.body.job_id}/cancel`);
    expect(late.status).toBe(409);
    expect(await late.json()).toMatchObject({ code: 'conflict', status: 'succeeded' });
    expect((await svc.post('/jobs/nope/cancel')).status).toBe(404);
  });
});

describe('rerun and fork (SPEC §4.6, §4.7)', () => {
  it('rerun repeats code, input and settings; fork swaps the code', async () => {
    const code = 'import json\nprint(json.load(open("/input/data.json"))["n"])';
    const s = await submit({ code, input_data: { n: 7 }, timeout: 9 });
    await result(s.body.job_id);
    const rr = await svc.post(`/jobs/${s.body.job_id}/rerun`);
    expect(rr.status).toBe(202);
    const rerun = (await rr.json()) as J;
    expect(rerun).toMatchObject({ parent_execution_id: s.body.job_id, relationship: 'rerun' });
    const rrec = (await result(rerun.job_id, 'wait=true&timeout=30&view=full')).body;
    expect(rrec).toMatchObject({ status: 'succeeded', stdout: '7\n', parent_execution_id: s.body.job_id, relationship: 'rerun', timeout: 9 });

    const fk = await svc.post(`/jobs/${s.body.job_id}/fork`, { code: 'import json\nprint(json.load(open("/input/data.json"))["n"] * 2)' });
    expect(fk.status).toBe(202);
    const fork = (await fk.json()) as J;
    expect(fork).toMatchObject({ parent_execution_id: s.body.job_id, relationship: 'fork' });
    const frec = (await result(fork.job_id, 'wait=true&timeout=30&view=full')).body;
    expect(frec).toMatchObject({ status: 'succeeded', stdout: '14\n', relationship: 'fork' });
    expect(frec.input_hash).toBe(rrec.input_hash);
    expect(frec.code_hash).not.toBe(rrec.code_hash);
  });

  it('errors: unknown → 404, fork without code → 400, unfinished → 409', async () => {
    expect((await svc.post('/jobs/nope/rerun')).status).toBe(404);
    const s = await submit({ code: 'import time; time.sleep(3)' });
    expect((await svc.post(`/jobs/${s.body.job_id}/fork`, {})).status).toBe(400);
    expect((await svc.post(`/jobs/${s.body.job_id}/rerun`)).status).toBe(409);
  });
});

describe('history (SPEC §4.12)', () => {
  it('paginates newest first with filters and the §2.8 shape', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await submit({ code: `print(${i})`, job_type: 'default' })).body.job_id);
    await Promise.all(ids.map((id) => result(id)));
    const page = await json(svc.get('/executions?limit=2&offset=0&status=succeeded&job_type=default'));
    expect(page).toMatchObject({ limit: 2, offset: 0, count: 2, has_more: true });
    expect(page.items).toHaveLength(2);
    expect(page.items.every((i: J) => i.status === 'succeeded' && i.job_type === 'default')).toBe(true);
    const times = page.items.map((i: J) => i.created_at);
    expect([...times].sort().reverse()).toEqual(times);
    const next = await json(svc.get('/executions?limit=2&offset=2&status=succeeded'));
    expect(next.items[0].execution_id).not.toBe(page.items[0].execution_id);
    const full = await json(svc.get('/executions?limit=1&view=full'));
    expect(full.items[0]).toHaveProperty('code_hash');
    const none = await json(svc.get('/executions?job_type=nonexistent'));
    expect(none).toMatchObject({ items: [], count: 0, has_more: false });
  });

  it.each(['limit=0', 'limit=1001', 'limit=abc', 'offset=-1', 'status=bogus', 'view=x'])('%s → 400', async (q) => {
    const res = await svc.get(`/executions?${q}`);
    expect(res.status).toBe(400);
    expect(((await res.json()) as J).detail).toBeTruthy();
  });

  it('unknown execution → 404', async () => {
    expect((await svc.get('/executions/nope')).status).toBe(404);
  });
});

describe('artifacts (SPEC §1.6, §2.5, §4.8)', () => {
  let id: string;
  let rec: J;
  beforeAll(async () => {
    const code = [
      'open("/output/hello.txt","w").write("hello world")',
      'open("/output/data.csv","w").write("a,b\\n1,2\\n")',
      'open("/output/big.bin","wb").write(b"x" * 10000)',
      'open("/output/result.json","w").write("{\\"ok\\": true}")',
    ].join('\n');
    id = (await submit({ code })).body.job_id;
    rec = (await result(id, 'wait=true&timeout=30&view=full')).body;
  });

  it('lists kept files with metadata, big ones as skipped, not result.json or control files', () => {
    expect(rec.status).toBe('succeeded');
    expect(rec.output).toEqual({ ok: true });
    const names = rec.artifacts.map((a: J) => a.name).sort();
    expect(names).toEqual(['big.bin', 'data.csv', 'hello.txt']);
    const hello = rec.artifacts.find((a: J) => a.name === 'hello.txt');
    expect(hello).toMatchObject({ size_bytes: 11, content_type: expect.stringContaining('text/plain') });
    expect(hello.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(rec.artifacts.find((a: J) => a.name === 'big.bin')).toMatchObject({ skipped: 'too_large', size_bytes: 10000 });
  });

  it('GET returns bytes with Content-Type, Content-Length, ETag, Content-Disposition; 304 on If-None-Match', async () => {
    const res = await svc.get(`/jobs/${id}/artifacts/hello.txt`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('hello world');
    expect(res.headers.get('content-type')).toContain('text/plain');
    expect(res.headers.get('content-length')).toBe('11');
    const etag = res.headers.get('etag');
    expect(etag).toBe(`"${rec.artifacts.find((a: J) => a.name === 'hello.txt').sha256}"`);
    expect(res.headers.get('content-disposition')).toContain('attachment; filename="hello.txt"');
    const again = await svc.get(`/jobs/${id}/artifacts/hello.txt`, { 'if-none-match': etag! });
    expect(again.status).toBe(304);
    expect(await again.text()).toBe('');
    const changed = await svc.get(`/jobs/${id}/artifacts/hello.txt`, { 'if-none-match': '"other"' });
    expect(changed.status).toBe(200);
  });

  it('HEAD gives the same headers and no body', async () => {
    const res = await svc.app.request(`/jobs/${id}/artifacts/data.csv`, { method: 'HEAD' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-length')).toBe('8');
    expect(res.headers.get('etag')).toMatch(/^"[0-9a-f]{64}"$/);
    expect(await res.text()).toBe('');
  });

  it('input artifacts _code.py and _input.json are downloadable and hash to code_hash/input_hash', async () => {
    const code = await svc.get(`/jobs/${id}/artifacts/_code.py`);
    expect(code.status).toBe(200);
    expect(code.headers.get('etag')).toBe(`"${rec.code_hash}"`);
    expect(await code.text()).toContain('hello world');
    const input = await svc.get(`/jobs/${id}/artifacts/_input.json`);
    expect(input.headers.get('etag')).toBe(`"${rec.input_hash}"`);
    expect(await input.json()).toEqual({});
  });

  it('skipped, unknown and hostile names never escape', async () => {
    expect((await svc.get(`/jobs/${id}/artifacts/big.bin`)).status).toBe(404);
    expect((await svc.get(`/jobs/${id}/artifacts/nope.txt`)).status).toBe(404);
    expect((await svc.get(`/jobs/nope/artifacts/hello.txt`)).status).toBe(404);
    for (const bad of ['..', '%2e%2e', '..%2F..%2Fetc%2Fpasswd', 'a%2Fb', 'a%5Cb', 'x%00y', '.svc_report.json', 'result.json']) {
      const res = await svc.get(`/jobs/${id}/artifacts/${bad}`);
      expect([400, 404]).toContain(res.status);
      expect(await res.text()).not.toContain('root:');
    }
  });
});

describe('SPEC §4.14 headers on every kind of response', () => {
  it('JSON, text, HTML, bytes, 304, HEAD, 202, 4xx and 404: each carries the three headers', async () => {
    const done = (await submit({ code: 'open("/output/a.txt","w").write("a")' })).body.job_id as string;
    await result(done, 'wait=true&timeout=30');
    const responses: [string, Response][] = [
      ['202 submission', await svc.post('/execute/async', { code: 'print(1)' }, { 'x-correlation-id': 'corr-1' })],
      ['health', await svc.get('/health', { 'x-correlation-id': 'corr-1' })],
      ['metrics (text)', await svc.get('/metrics', { 'x-correlation-id': 'corr-1' })],
      ['docs (html)', await svc.get('/docs', { 'x-correlation-id': 'corr-1' })],
      ['artifact bytes', await svc.get(`/jobs/${done}/artifacts/a.txt`, { 'x-correlation-id': 'corr-1' })],
      ['artifact 304', await svc.get(`/jobs/${done}/artifacts/a.txt`, { 'x-correlation-id': 'corr-1', 'if-none-match': '*' })],
      ['artifact HEAD', await svc.app.request(`/jobs/${done}/artifacts/a.txt`, { method: 'HEAD', headers: { 'x-correlation-id': 'corr-1' } })],
      ['400', await svc.post('/execute/async', { code: '' }, { 'x-correlation-id': 'corr-1' })],
      ['404 job', await svc.get('/jobs/nope', { 'x-correlation-id': 'corr-1' })],
      ['404 route', await svc.get('/no/such/route', { 'x-correlation-id': 'corr-1' })],
    ];
    for (const [what, res] of responses) {
      const h = { what, status: res.status, corr: res.headers.get('x-correlation-id'), nosniff: res.headers.get('x-content-type-options'), frame: res.headers.get('x-frame-options') };
      expect(h).toEqual({ what, status: res.status, corr: 'corr-1', nosniff: 'nosniff', frame: 'DENY' });
    }
    expect(responses.map(([, r]) => r.status)).toEqual([202, 200, 200, 200, 200, 304, 200, 400, 404, 404]);
  });
});

describe('operations', () => {
  it('GET /pool/stats, /metrics, /openapi.json, /docs', async () => {
    const p = await json(svc.get('/pool/stats'));
    expect(p).toMatchObject({ slots: { size: 2 }, queue: { max_queue_size: 1000 } });
    expect(typeof p.queue.queued).toBe('number');
    const m = await (await svc.get('/metrics')).text();
    expect(m).toContain('sandpod_runs_total{status="succeeded",job_type="default"');
    expect(m).toContain('sandpod_run_duration_seconds_bucket');
    expect(m).toContain('sandpod_queue_wait_seconds_bucket');
    expect(m).toContain('sandpod_queue_depth{state="queued"}');
    expect(m).toContain('sandpod_circuit_breaker_state 0');
    const o = await json(svc.get('/openapi.json'));
    expect(o.openapi).toBe('3.1.0');
    const ref = o.paths['/execute/async'].post.requestBody.content['application/json'].schema.$ref as string;
    expect(o.components.schemas[ref.split('/').pop()!].properties).toHaveProperty('idempotency_key');
    const docs = await svc.get('/docs');
    expect(docs.headers.get('content-type')).toContain('text/html');
  });
});
