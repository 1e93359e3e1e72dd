/**
 * The generated OpenAPI document is the contract: every operation is called on the running service
 * (real database, real sandbox) for its success and main error answers, and each real answer is
 * validated against the document with ajv — the status must be documented, the body must match its
 * schema (fixed shapes are closed, so an undocumented field fails), and non-JSON answers must carry
 * the documented media type and headers.
 */
import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertDlq } from '../../../src/store/dlq.repository.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
type Doc = { paths: Record<string, Record<string, J>>; components: J };

let svc: TestService;
let doc: Doc;
const ajv = new Ajv2020({ strict: false, allErrors: true });
(addFormats as unknown as (a: Ajv2020) => void)(ajv);
const compiled = new Map<string, ValidateFunction>();
/** method path → statuses seen */
const seen = new Map<string, Set<number>>();

beforeAll(async () => {
  svc = await startTestService({ max_artifact_bytes: 4096, max_body_bytes: 64 * 1024, max_code_bytes: 8 * 1024 });
  doc = (await (await svc.get('/openapi.json')).json()) as Doc;
  ajv.addSchema({ $id: 'doc.json', components: doc.components });
}, 60_000);
afterAll(async () => {
  await svc?.close();
});

function validatorFor(schema: J): ValidateFunction {
  const key = JSON.stringify(schema);
  let fn = compiled.get(key);
  if (!fn) {
    fn = ajv.compile(JSON.parse(key.replaceAll('"#/components/', '"doc.json#/components/')) as J);
    compiled.set(key, fn);
  }
  return fn;
}

/** The errors worth reading: with anyOf, the root-level "additional property" of the wrong branches is noise. */
function explain(errors: ErrorObject[]): string {
  const deep = errors.filter((e) => !(e.keyword === 'additionalProperties' && e.instancePath === ''));
  return (deep.length > 0 ? deep : errors)
    .slice(0, 8)
    .map((e) => `${e.instancePath || '/'} ${e.message} ${JSON.stringify(e.params)}`)
    .join('; ');
}

/** Checks a real answer of `method path` (a document path) against the document; returns its JSON body. */
async function check(method: string, path: string, res: Response): Promise<J> {
  const op = doc.paths[path]?.[method];
  expect(op, `${method} ${path} is documented`).toBeDefined();
  const documented = op!.responses[String(res.status)];
  expect(documented, `${method.toUpperCase()} ${path} answered ${res.status}, which the document does not list`).toBeDefined();
  const key = `${method} ${path}`;
  if (!seen.has(key)) seen.set(key, new Set());
  seen.get(key)!.add(res.status);
  for (const h of Object.keys(documented.headers ?? {})) {
    if (method === 'head' || res.status !== 304 || h === 'ETag') expect(res.headers.get(h), `${key} ${res.status} header ${h}`).not.toBeNull();
  }
  const content = documented.content as Record<string, { schema: J }> | undefined;
  const type = res.headers.get('content-type') ?? '';
  if (!content || method === 'head' || res.status === 304) {
    expect(await res.text()).toBe('');
    return {};
  }
  if (!content['application/json']) {
    expect(Object.keys(content).some((m) => type.startsWith(m) || m === 'application/octet-stream'), `${key} ${res.status} media type ${type}`).toBe(true);
    await res.arrayBuffer();
    return {};
  }
  expect(type).toContain('application/json');
  const body = (await res.json()) as J;
  const validate = validatorFor(content['application/json'].schema);
  const ok = validate(body);
  expect(ok, `${key} ${res.status}: ${explain(validate.errors ?? [])}\n${JSON.stringify(body).slice(0, 2000)}`).toBe(true);
  return body;
}

const get = (p: string, h?: Record<string, string>) => svc.get(p, h);
const post = (p: string, b?: unknown, h?: Record<string, string>) => svc.post(p, b, h);
const sleepCode = (s: number) => `import time\ntime.sleep(${s})`;

async function waitFor(id: string): Promise<void> {
  const r = await get(`/jobs/${id}/result?wait=true&timeout=60`);
  expect(r.status).toBe(200);
  await r.arrayBuffer();
}

async function untilRunning(id: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const s = (await (await get(`/jobs/${id}`)).json()) as J;
    if (s.status === 'running') return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`job ${id} never ran`);
}

describe('every operation answers as the document says', () => {
  let done: string; // a finished job with artifacts

  it('POST /execute: 200, 400, 413, 415', async () => {
    const ok = await check('post', '/execute', await post('/execute', { code: 'print(1)' }));
    expect(ok.success).toBe(true);
    const failed = await check('post', '/execute', await post('/execute', { code: 'raise ValueError("x")' }));
    expect(failed.error.type).toBe('value_error');
    expect((await check('post', '/execute', await post('/execute', { code: '' }))).code).toBe('validation_error');
    await check('post', '/execute', await post('/execute', { code: 'x'.repeat(100 * 1024) }));
    await check('post', '/execute', await svc.app.request('/execute', { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'print(1)' }));
    expect(seen.get('post /execute')).toEqual(new Set([200, 400, 413, 415]));
  });

  it('POST /execute/async: 202, 200 replay, 409, 400, 415', async () => {
    const key = `contract-${Date.now()}`;
    const code = 'open("/output/a.txt","w").write("hello")\nopen("/output/big.bin","wb").write(b"x"*10000)\nimport json; json.dump({"n": 1}, open("/output/result.json","w"))';
    const a = await check('post', '/execute/async', await post('/execute/async', { code, idempotency_key: key, input_data: { k: 'v' } }));
    done = a.job_id;
    const replay = await check('post', '/execute/async', await post('/execute/async', { code, idempotency_key: key, input_data: { k: 'v' } }));
    expect(replay).toMatchObject({ job_id: done, created: false });
    const conflict = await check('post', '/execute/async', await post('/execute/async', { code: 'print(2)', idempotency_key: key }));
    expect(conflict.existing_job_id).toBe(done);
    await check('post', '/execute/async', await post('/execute/async', { code: 'print(1)', timeout: 0 }));
    await check('post', '/execute/async', await svc.app.request('/execute/async', { method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{}' }));
    await waitFor(done);
  });

  it('GET /jobs/{id}: brief, full, 400, 404', async () => {
    expect(await check('get', '/jobs/{id}', await get(`/jobs/${done}`))).not.toHaveProperty('stdout');
    expect(await check('get', '/jobs/{id}', await get(`/jobs/${done}?view=full`))).toHaveProperty('code_hash');
    await check('get', '/jobs/{id}', await get(`/jobs/${done}?view=bogus`));
    await check('get', '/jobs/{id}', await get('/jobs/no-such-job'));
  });

  it('GET /jobs/{id}/result: 200 (both views), 202, 408, 400, 404; cancel 200/409/404', async () => {
    expect((await check('get', '/jobs/{id}/result', await get(`/jobs/${done}/result`))).output).toEqual({ n: 1 });
    const full = await check('get', '/jobs/{id}/result', await get(`/jobs/${done}/result?view=full`));
    expect(full.artifacts.map((x: J) => x.name).sort()).toEqual(['a.txt', 'big.bin']);
    const slow = (await (await post('/execute/async', { code: sleepCode(30), timeout: 60 })).json()) as J;
    const notReady = await check('get', '/jobs/{id}/result', await get(`/jobs/${slow.job_id}/result`));
    expect(notReady.job_id).toBe(slow.job_id);
    await check('get', '/jobs/{id}/result', await get(`/jobs/${slow.job_id}/result?wait=true&timeout=1`));
    await check('get', '/jobs/{id}/result', await get(`/jobs/${slow.job_id}/result?wait=maybe`));
    await check('get', '/jobs/{id}/result', await get('/jobs/nope/result'));
    await check('get', '/jobs/{id}/events', await get(`/jobs/${done}/events`));
    await check('get', '/jobs/{id}/events', await get(`/jobs/${done}/events`, { 'Last-Event-ID': 'x' }));
    await check('get', '/jobs/{id}/events', await get('/jobs/nope/events'));
    expect(await check('get', '/jobs/{id}/deliveries', await get(`/jobs/${done}/deliveries`))).toEqual({ job_id: done, callback_url: null, deliveries: [] });
    await check('get', '/jobs/{id}/deliveries', await get('/jobs/nope/deliveries'));
    await untilRunning(slow.job_id);
    expect((await check('post', '/jobs/{id}/cancel', await post(`/jobs/${slow.job_id}/cancel`))).status).toBe('cancelled');
    await check('post', '/jobs/{id}/cancel', await post(`/jobs/${done}/cancel`));
    await check('post', '/jobs/{id}/cancel', await post('/jobs/nope/cancel'));
    expect(seen.get('get /jobs/{id}/result')).toEqual(new Set([200, 202, 408, 400, 404]));
  });

  it('rerun and fork: 202, 400, 404, 409, 413, 415', async () => {
    expect(await check('post', '/jobs/{id}/rerun', await post(`/jobs/${done}/rerun`))).toMatchObject({ relationship: 'rerun', parent_execution_id: done });
    await check('post', '/jobs/{id}/rerun', await post('/jobs/nope/rerun'));
    const fork = await check('post', '/jobs/{id}/fork', await post(`/jobs/${done}/fork`, { code: 'print(3)' }));
    expect(fork).toMatchObject({ relationship: 'fork', status: 'pending' });
    await check('post', '/jobs/{id}/fork', await post(`/jobs/${done}/fork`, {}));
    await check('post', '/jobs/{id}/fork', await post('/jobs/nope/fork', { code: 'print(1)' }));
    await check('post', '/jobs/{id}/fork', await post(`/jobs/${done}/fork`, { code: 'x'.repeat(100 * 1024) }));
    await check('post', '/jobs/{id}/fork', await svc.app.request(`/jobs/${done}/fork`, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'print(1)' }));
    const running = (await (await post('/execute/async', { code: sleepCode(30), timeout: 60 })).json()) as J;
    await check('post', '/jobs/{id}/rerun', await post(`/jobs/${running.job_id}/rerun`));
    await check('post', '/jobs/{id}/fork', await post(`/jobs/${running.job_id}/fork`, { code: 'print(1)' }));
    // Not settled yet when cancelled while queued or starting: either answer is documented.
    await check('post', '/jobs/{id}/cancel', await post(`/jobs/${running.job_id}/cancel`));
    await waitFor(fork.job_id);
  });

  it('artifacts: GET 200 (bytes + headers), 304, HEAD, 400, 404', async () => {
    const path = '/jobs/{id}/artifacts/{name}';
    const res = await get(`/jobs/${done}/artifacts/a.txt`);
    const etag = res.headers.get('etag')!;
    expect(res.headers.get('content-disposition')).toContain('a.txt');
    await check('get', path, res);
    await check('get', path, await get(`/jobs/${done}/artifacts/a.txt`, { 'if-none-match': etag }));
    await check('get', path, await get(`/jobs/${done}/artifacts/_input.json`));
    await check('head', path, await svc.app.request(`/jobs/${done}/artifacts/a.txt`, { method: 'HEAD' }));
    await check('get', path, await get(`/jobs/${done}/artifacts/a%5Cb`));
    await check('get', path, await get(`/jobs/${done}/artifacts/big.bin`));
    expect(seen.get(`get ${path}`)).toEqual(new Set([200, 304, 400, 404]));
  });

  it('history: GET /executions (both views), 400; GET /executions/{id} (both views), 400, 404', async () => {
    const page = await check('get', '/executions', await get('/executions?limit=5'));
    expect(page.count).toBeGreaterThan(0);
    await check('get', '/executions', await get('/executions?limit=5&view=full&status=pending'));
    await check('get', '/executions', await get('/executions?view=full&status=succeeded'));
    await check('get', '/executions', await get('/executions?limit=0'));
    await check('get', '/executions/{id}', await get(`/executions/${done}`));
    await check('get', '/executions/{id}', await get(`/executions/${done}?view=full`));
    await check('get', '/executions/{id}', await get(`/executions/${done}?view=x`));
    await check('get', '/executions/{id}', await get('/executions/nope'));
  });

  it('job types: list, one, 404; build, its records, 400 and 404', async () => {
    expect((await check('get', '/job-types', await get('/job-types'))).map((t: J) => t.name)).toEqual(['data', 'default', 'http']);
    await check('get', '/job-types/{name}', await get('/job-types/default'));
    await check('get', '/job-types/{name}', await get('/job-types/nope'));
    const built = await check('post', '/job-types/{name}/build', await post('/job-types/default/build'));
    expect(built.status).toBe('built');
    await check('get', '/job-types/{name}', await get('/job-types/default'));
    await check('get', '/job-types/{name}/builds', await get('/job-types/default/builds'));
    await check('get', '/job-types/{name}/builds/{id}', await get(`/job-types/default/builds/${built.id}`));
    await check('get', '/job-types/{name}/builds/{id}', await get('/job-types/default/builds/nope'));
    await check('post', '/job-types/{name}/build', await post('/job-types/default/build?version_tag=not-semver'));
    await check('post', '/job-types/{name}/build', await post('/job-types/nope/build'));
  });

  it('operations: health, livez, readyz, pool stats (with a queued job), metrics', async () => {
    await check('get', '/health', await get('/health'));
    await check('get', '/livez', await get('/livez'));
    await check('get', '/readyz', await get('/readyz'));
    const a = (await (await post('/execute/async', { code: sleepCode(2) })).json()) as J;
    const b = (await (await post('/execute/async', { code: sleepCode(2) })).json()) as J;
    const c = (await (await post('/execute/async', { code: sleepCode(2), job_type: 'data' })).json()) as J;
    const stats = await check('get', '/pool/stats', await get('/pool/stats'));
    expect(Object.keys(stats.by_job_type).length).toBeGreaterThan(0);
    await check('get', '/metrics', await get('/metrics'));
    expect((await check('get', '/openapi.json', await get('/openapi.json'))).openapi).toBe('3.1.0');
    await check('get', '/docs', await get('/docs'));
    for (const j of [a, b, c]) await post(`/jobs/${j.job_id}/cancel`);
  });

  it('dead letter queue: page, 400, stats, delete 200/404/400', async () => {
    for (const t of ['internal_error', 'service_unavailable']) {
      await insertDlq(svc.db.kysely, {
        jobId: done,
        jobData: { code: 'print(1)', input_data: {}, job_type: 'default', timeout: 30 },
        errorType: t,
        errorMessage: 'boom',
        retryCount: 1,
        clientIp: null,
        correlationId: 'c-1',
      });
    }
    const page = await check('get', '/dlq', await get('/dlq?limit=1'));
    expect(page).toMatchObject({ count: 1, has_more: true });
    await check('get', '/dlq', await get('/dlq?error_type=internal_error'));
    await check('get', '/dlq', await get('/dlq?offset=-1'));
    expect((await check('get', '/dlq/stats', await get('/dlq/stats'))).total).toBe(2);
    await check('delete', '/dlq/{id}', await svc.app.request(`/dlq/${page.items[0].id}`, { method: 'DELETE' }));
    await check('delete', '/dlq/{id}', await svc.app.request('/dlq/999999', { method: 'DELETE' }));
    await check('delete', '/dlq/{id}', await svc.app.request('/dlq/abc', { method: 'DELETE' }));
  });

  it('sessions: create, list, one, a cell, files (PUT, GET, HEAD, list, DELETE), close, events', async () => {
    const s = await check('post', '/sessions', await post('/sessions', {}));
    const id = s.session_id as string;
    await check('get', '/sessions', await get('/sessions'));
    await check('get', '/sessions/{id}', await get(`/sessions/${id}`));
    const cell = await check('post', '/sessions/{id}/execute', await post(`/sessions/${id}/execute`, { code: 'x = 41\nprint(x + 1)' }));
    expect(cell, JSON.stringify(cell)).toMatchObject({ stdout: '42\n' });
    const file = `/sessions/${id}/files/data.csv`;
    await check('put', '/sessions/{id}/files/{name}', await svc.app.request(file, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: 'a,b\n1,2\n' }));
    await check('get', '/sessions/{id}/files', await get(`/sessions/${id}/files`));
    await check('get', '/sessions/{id}/files/{name}', await get(file));
    await check('head', '/sessions/{id}/files/{name}', await svc.app.request(file, { method: 'HEAD' }));
    await check('delete', '/sessions/{id}/files/{name}', await svc.app.request(file, { method: 'DELETE' }));
    await check('delete', '/sessions/{id}', await svc.app.request(`/sessions/${id}`, { method: 'DELETE' }));
    await check('get', '/sessions/{id}/events', await get(`/sessions/${id}/events`));
    await check('get', '/sessions/{id}/events', await get(`/sessions/${id}/events`, { 'Last-Event-ID': 'x' }));
    await check('get', '/sessions/{id}/events', await get('/sessions/nope/events'));
  }, 120_000);

  it('with the circuit breaker open: POST /execute 503 with the §2.2 body, /health 503 degraded', async () => {
    for (let i = 0; i < 10 && svc.breaker.state !== 'open'; i++) await svc.breaker.exec(() => Promise.reject(new Error('engine down'))).catch(() => {});
    expect(svc.breaker.state).toBe('open');
    expect(await check('post', '/execute', await post('/execute', { code: 'print(1)' }))).toMatchObject({ code: 'service_unavailable', error: { type: 'service_unavailable' } });
    // A session cell answers the same way.
    const session = (await check('post', '/sessions', await post('/sessions', {}))).session_id as string;
    const cell = await check('post', '/sessions/{id}/execute', await post(`/sessions/${session}/execute`, { code: 'print(1)' }));
    expect(cell).toMatchObject({ code: 'service_unavailable', error: { type: 'service_unavailable' }, session_id: session, cell: 1 });
    expect(seen.get('post /sessions/{id}/execute')).toContain(503);
    expect((await check('get', '/health', await get('/health'))).status).toBe('degraded');
  });

  it('every documented operation was called, with a success answer', () => {
    const missing: string[] = [];
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(item)) {
        const statuses = seen.get(`${method} ${path}`);
        const wantsSuccess = Object.keys(op.responses).some((s) => s.startsWith('2'));
        if (!statuses || (wantsSuccess && ![...statuses].some((s) => s >= 200 && s < 300))) missing.push(`${method} ${path}`);
      }
    }
    expect(missing).toEqual([]);
  });
});

describe('the document itself', () => {
  it('names every operation, gives each 2xx and 4xx JSON answer a schema, and states servers and security', () => {
    expect((doc as J).servers).toEqual([expect.objectContaining({ url: '.' })]);
    expect((doc as J).security).toEqual([]);
    const ids = new Set<string>();
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(item)) {
        expect(op.operationId, `${method} ${path}`).toMatch(/^[a-z][A-Za-z]+$/);
        expect(ids.has(op.operationId), `duplicate operationId ${op.operationId}`).toBe(false);
        ids.add(op.operationId);
        for (const [status, r] of Object.entries(op.responses as Record<string, J>)) {
          // HEAD, 304 and 204 answers have no body, so no schema.
          if (method === 'head' || status === '304' || status === '204') continue;
          const schema = Object.values((r.content ?? {}) as Record<string, J>)[0]?.schema;
          expect(schema, `${method} ${path} ${status} has a schema`).toBeDefined();
        }
      }
    }
  });

  it('closes fixed shapes and states the request limits of this configuration', () => {
    const s = doc.components.schemas;
    for (const name of ['SyncResult', 'ExecutionRecord', 'ExecutionRecordFull', 'Error', 'Submission', 'JobStatus', 'NotReady', 'Health', 'PoolStats', 'DlqEntry', 'ExecutionsPage']) {
      expect(s[name]?.additionalProperties, name).toBe(false);
    }
    const req = s.ExecuteAsyncRequest;
    expect(req.properties.code).toMatchObject({ maxLength: 8 * 1024, 'x-max-bytes': 8 * 1024 });
    expect(req.properties.input_data['x-max-bytes']).toBe(svc.config.max_input_bytes);
    expect(req.properties.timeout).toMatchObject({ minimum: 1, maximum: svc.config.max_timeout });
    expect(req.properties.startup_timeout).toMatchObject({ minimum: 10, maximum: 600, default: 60 });
    expect(req.description).toContain(String(64 * 1024));
    expect(req['x-max-bytes']).toBe(64 * 1024);
    expect(s.ForkRequest['x-max-bytes']).toBe(64 * 1024);
    const wait = (doc.paths['/jobs/{id}/result']!.get!.parameters as J[]).find((p) => p.name === 'timeout');
    expect(wait?.schema).toMatchObject({ type: 'integer', minimum: 1, maximum: 300, default: 30 });
  });
});
