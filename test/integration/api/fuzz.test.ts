/**
 * Property-based fuzzing of the whole HTTP surface against the real app and a real database
 * (fast-check). Generated bodies (arbitrary JSON, strings with control characters, NUL and lone
 * surrogates, deep nesting, huge numbers, wrong types, duplicate keys, broken JSON), headers
 * (`X-Correlation-ID` garbage, `Content-Type` variants, `If-None-Match` forms), paths (encoded
 * slashes, dot segments, Unicode ids) and query strings, for every endpoint.
 *
 * Invariants, for every response: no 5xx; the SPEC §4.14 headers; an error status carries the
 * error body `{detail, code, correlation_id}`; every job the API accepted is a row afterwards.
 *
 * Seeded and bounded: `SANDPOD_FUZZ_RUNS` (default 1) multiplies the number of cases and
 * `SANDPOD_FUZZ_SEED` picks the seed (default fixed, so CI is reproducible); a failure prints the
 * seed and path to replay it.
 */
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canonical, parseJson } from '../../../src/util/json.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const SCALE = Math.max(1, Number(process.env.SANDPOD_FUZZ_RUNS ?? 1));
const SEED = Number(process.env.SANDPOD_FUZZ_SEED ?? 20261123);
const runs = (n: number) => Math.round(n * SCALE);

type J = Record<string, any>;

/** Every case goes through here: the invariants hold for any response. */
async function check(res: Response, what: string): Promise<{ status: number; body: unknown }> {
  const text = await res.text();
  const where = `${what} → ${res.status} ${text.slice(0, 300)}`;
  expect(res.status, where).toBeLessThan(500);
  expect(res.headers.get('x-correlation-id'), where).toMatch(/^[A-Za-z0-9._:-]{1,128}$/);
  expect(res.headers.get('x-content-type-options'), where).toBe('nosniff');
  expect(res.headers.get('x-frame-options'), where).toBe('DENY');
  let body: unknown = null;
  if (res.status >= 400 && text !== '') {
    body = JSON.parse(text);
    const b = body as J;
    expect(typeof b.detail, where).toBe('string');
    expect(typeof b.code, where).toBe('string');
    expect(b.correlation_id, where).toBe(res.headers.get('x-correlation-id'));
  } else if ((res.headers.get('content-type') ?? '').includes('json') && text !== '') {
    body = JSON.parse(text);
  }
  return { status: res.status, body };
}

/** JSON text with keys sorted at every level; `__proto__` stays an own key. */
function sortedJson(value: unknown): string {
  const sort = (x: unknown): unknown => {
    if (Array.isArray(x)) return x.map(sort);
    if (x && typeof x === 'object') {
      const o: Record<string, unknown> = {};
      for (const k of Object.keys(x).sort()) Object.defineProperty(o, k, { value: sort((x as J)[k]), enumerable: true, writable: true, configurable: true });
      return o;
    }
    return x;
  };
  return JSON.stringify(sort(value));
}

// ---- generators ---------------------------------------------------------------------------------

/** Strings that stress storage and serialization: NUL, C0 controls, lone surrogates, astral chars. */
const nastyChar = fc.oneof(
  fc.constantFrom('\u0000', '\u0001', '\u001f', '\u007f', '\u2028', '\u2029', '\ufeff', '\ufffd', '"', '\\', '/', '\n', '\r'),
  fc.integer({ min: 0xd800, max: 0xdfff }).map((n) => String.fromCharCode(n)),
  fc.constantFrom('😀', '𝄞', 'é', 'ß', '中'),
  fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }),
);
const nastyString = fc.string({ unit: nastyChar, maxLength: 40 });
const anyKey = fc.oneof(nastyString, fc.constantFrom('__proto__', 'constructor', 'prototype', 'toString', 'hasOwnProperty', ''));
const bigNumber = fc.oneof(
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.constantFrom(2 ** 53 + 1, -(2 ** 53) - 1, 1e308, -1e308, 5e-324, 0.1 + 0.2, -0),
);
const jsonLeaf = fc.oneof(nastyString, bigNumber, fc.integer(), fc.boolean(), fc.constant(null));
const { json: jsonValue } = fc.letrec<{ json: unknown; obj: Record<string, unknown> }>((tie) => ({
  json: fc.oneof({ depthSize: 'small', withCrossShrink: true }, jsonLeaf, fc.array(tie('json'), { maxLength: 4 }), tie('obj')),
  obj: fc.dictionary(anyKey, tie('json'), { maxKeys: 4 }).map((d) => {
    // fc.dictionary builds with plain assignment; rebuild so `__proto__` is an own key.
    const o: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(d)) Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
    return o;
  }),
}));

/**
 * JSON number texts a double cannot hold or spells another way: integers far beyond 2^53, decimals
 * with more digits than a double keeps, exponents out of a double's range, `1.0`, `1E+2`, `-0`.
 */
const digits = (max: number) => fc.string({ unit: fc.constantFrom(...'0123456789'), minLength: 1, maxLength: max });
const intText = fc.oneof(fc.bigInt({ min: -(10n ** 40n), max: 10n ** 40n }).map(String), fc.constantFrom('0', '-0', '9007199254740993', '-9007199254740993'));
const numberText = fc.oneof(
  intText,
  fc.tuple(intText, digits(40)).map(([i, f]) => `${i}.${f}`),
  fc.tuple(fc.oneof(intText, fc.tuple(intText, digits(20)).map(([i, f]) => `${i}.${f}`)), fc.constantFrom('e', 'E', 'e+', 'E-', 'e-'), fc.integer({ min: 0, max: 400 })).map(([m, e, x]) => `${m}${e}${x}`),
  fc.constantFrom('1.0', '100.00', '1e2', '1E+2', '-0.0', '0e0', '123456789012345678901234567890', '0.1000000000000000055511151231257827', '1e400', '-1e-400'),
  fc.double({ noNaN: true, noDefaultInfinity: true }).map(String),
);
const space = fc.constantFrom('', ' ', '\n', '\t', ' \r\n  ');
/** A JSON value as sent (keys in any order, any spacing) and its canonical text (keys sorted, numbers verbatim). */
type Texts = { sent: string; canon: string };
const byKey = ([a]: [string, Texts], [b]: [string, Texts]) => (a < b ? -1 : a > b ? 1 : 0);
const { object: exactObject } = fc.letrec<{ value: Texts; object: Texts }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    numberText.map((n) => ({ sent: n, canon: n })),
    fc.oneof(nastyString.map((x) => JSON.stringify(x)), fc.constantFrom('true', 'false', 'null')).map((t) => ({ sent: t, canon: t })),
    fc.tuple(fc.array(tie('value'), { maxLength: 4 }), space).map(([items, sp]) => ({
      sent: `[${sp}${items.map((i) => i.sent).join(`${sp},`)}]`,
      canon: `[${items.map((i) => i.canon).join(',')}]`,
    })),
    tie('object'),
  ),
  object: fc.tuple(fc.uniqueArray(fc.tuple(anyKey, tie('value')), { maxLength: 4, selector: ([k]) => k }), space).map(([entries, sp]) => ({
    sent: `{${sp}${entries.map(([k, v]) => `${JSON.stringify(k)}${sp}:${sp}${v.sent}`).join(`,${sp}`)}${sp}}`,
    canon: `{${[...entries].sort(byKey).map(([k, v]) => `${JSON.stringify(k)}:${v.canon}`).join(',')}}`,
  })),
}));

/** Raw JSON texts no JSON.stringify produces: deep nesting, huge literals, duplicate keys, garbage. */
const rawInputText = fc.oneof(
  exactObject.map((t) => t.sent),
  fc.integer({ min: 1, max: 20_000 }).map((d) => `${'{"a":'.repeat(d)}1${'}'.repeat(d)}`),
  fc.integer({ min: 1, max: 20_000 }).map((d) => `{"x":${'['.repeat(d)}${']'.repeat(d)}}`),
  fc.constantFrom(
    '{"n":123456789012345678901234567890}',
    '{"n":1e400}',
    '{"n":-1e-400}',
    '{"n":0.30000000000000004}',
    '{"a":1,"a":2}',
    '{"__proto__":{"x":1},"constructor":{"prototype":{}}}',
    '{"s":"\\u0000\\ud800\\udfff"}',
  ),
);

const code = fc.oneof(
  fc.constant('print(1)'),
  nastyString,
  fc.constantFrom('', '   ', 'print("\\x00")', 'import sys; sys.stdout.buffer.write(b"\\xff\\xfe\\x00")', 'x'.repeat(200_000)),
);
const wrongType = fc.oneof(fc.integer(), fc.boolean(), fc.constant(null), fc.array(fc.integer(), { maxLength: 3 }), nastyString, fc.dictionary(fc.string(), fc.integer(), { maxKeys: 2 }));

/** Bodies of the submission endpoints: mostly the right shape with bad values, sometimes garbage. */
const submissionBody = fc.oneof(
  fc
    .record(
      {
        code,
        input_data: fc.oneof(jsonValue, fc.constant({})),
        timeout: fc.oneof(fc.integer({ min: -5, max: 400 }), wrongType),
        startup_timeout: fc.oneof(fc.integer({ min: 0, max: 700 }), wrongType),
        job_type: fc.oneof(fc.constantFrom('default', 'data', 'nope'), nastyString, wrongType),
        requirements: fc.oneof(fc.array(fc.oneof(nastyString, fc.constantFrom('numpy', '-e .', 'http://x/y.whl', 'a>=1,<2')), { maxLength: 3 }), wrongType),
        idempotency_key: fc.oneof(nastyString, wrongType),
        extra: jsonValue,
      },
      { requiredKeys: [] },
    )
    .map((b) => JSON.stringify(b)),
  rawInputText.map((t) => `{"code":"print(1)","input_data":${t}}`),
  fc.constantFrom('{"code":"print(1)","code":"print(2)"}', '{"code":', '[]', 'null', '"x"', '{}', '\u0000', '{"code":"print(1)"}garbage'),
  nastyString,
);

const contentType = fc.constantFrom('application/json', 'application/json; charset=utf-8', 'APPLICATION/JSON', 'application/vnd.x+json', 'text/plain', '', 'multipart/form-data; boundary=x', 'application/x-www-form-urlencoded');
/** Header values as fetch accepts them (Latin-1 without CR, LF or NUL), garbage otherwise. */
const headerValue = fc.string({ unit: fc.integer({ min: 0x20, max: 0xff }).map((n) => String.fromCharCode(n)), maxLength: 200 });
const correlationId = fc.oneof(headerValue, fc.constantFrom('ok-id.1:2', 'x'.repeat(129), '', ' ', 'a b'));
const ifNoneMatch = fc.oneof(headerValue, fc.constantFrom('*', 'W/"abc"', '"abc", W/"def"', '""', ','));

/** Path segments: encoded slashes, dot segments, Unicode, very long. */
const segment = fc.oneof(
  fc.uuid(),
  fc.constantFrom('..', '.', '%2e%2e', '%2F', 'a%2Fb', '%00', '%ff', '%', 'ü', '%C3%BC', '😀', '_code.py', '_input.json', 'result.json', '.svc_report.json', 'x'.repeat(300)),
  // Percent-encoded UTF-8 bytes (a lone surrogate becomes U+FFFD's bytes, as a browser would send).
  nastyString.map((s) => [...Buffer.from(s, 'utf8')].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('')),
);
const queryString = fc
  .dictionary(
    fc.constantFrom('view', 'wait', 'timeout', 'limit', 'offset', 'status', 'job_type', 'error_type', 'version_tag', 'x'),
    fc.oneof(fc.constantFrom('full', 'summary', 'true', 'false', '1', '0', '-1', '1001', '99999999999999999999', 'pending', 'queued', 'succeeded', ''), headerValue),
    { maxKeys: 4 },
  )
  .map((q) => {
    // A long-poll on a job that never finishes would wait `timeout` seconds: keep those short.
    if (q.wait === 'true' || q.wait === '1') q.timeout = '1';
    return new URLSearchParams(q).toString();
  });

describe('fuzzing every endpoint (fast-check)', () => {
  let svc: TestService;
  const accepted = new Set<string>();

  beforeAll(async () => {
    // API-only replica: async jobs are accepted and stay queued (nothing to wait for); sync runs
    // still run for real in the sandbox.
    svc = await startTestService({ dispatch: false, max_queue_size: 1_000_000 });
  });
  afterAll(async () => {
    await svc?.close();
  });

  function request(method: string, path: string, init: { body?: string; headers?: Record<string, string> } = {}): Promise<Response> {
    return Promise.resolve(svc.app.request(path, { method, headers: init.headers ?? {}, ...(init.body === undefined ? {} : { body: init.body }) }));
  }

  function noteAccepted(r: { status: number; body: unknown }): void {
    const b = r.body as J | null;
    if ((r.status === 202 || r.status === 200) && b && typeof b.job_id === 'string') accepted.add(b.job_id);
  }

  it('POST /execute/async and /execute with generated bodies and headers', async () => {
    await fc.assert(
      fc.asyncProperty(submissionBody, contentType, fc.option(correlationId), fc.boolean(), async (body, type, cid, sync) => {
        const headers: Record<string, string> = type ? { 'content-type': type } : {};
        if (cid !== null) headers['x-correlation-id'] = cid;
        // Sync runs start a real sandbox: a sample of them is enough.
        const path = sync && body.length < 5000 ? '/execute' : '/execute/async';
        const res = await request('POST', path, { body, headers });
        // A usable correlation id is kept; anything else is replaced (check() vets the replacement).
        if (cid !== null && /^[A-Za-z0-9._:-]{1,128}$/.test(cid)) expect(res.headers.get('x-correlation-id')).toBe(cid);
        else if (cid !== null) expect(res.headers.get('x-correlation-id')).not.toBe(cid);
        const r = await check(res, `POST ${path} ${body.slice(0, 200)}`);
        if (path === '/execute/async') noteAccepted(r);
      }),
      { numRuns: runs(400), seed: SEED },
    );
  });

  it('the submitted input reaches the record unchanged (fidelity)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.dictionary(anyKey, jsonValue, { maxKeys: 5 }), async (raw) => {
        const input: Record<string, unknown> = {};
        for (const [k, v] of Object.entries(raw)) Object.defineProperty(input, k, { value: v, enumerable: true, writable: true, configurable: true });
        const text = JSON.stringify({ code: 'print(1)', input_data: input });
        const r = await check(await request('POST', '/execute/async', { body: text, headers: { 'content-type': 'application/json' } }), `POST /execute/async ${text.slice(0, 200)}`);
        if (r.status !== 202) return; // over a size limit: refused with a 4xx, which check() vetted
        noteAccepted(r);
        const id = (r.body as J).job_id as string;
        const rec = await check(await request('GET', `/jobs/${id}?view=full`), `GET /jobs/${id}`);
        expect(rec.status).toBe(200);
        // Same value: NUL, lone surrogates and key names such as __proto__ must survive (key order aside).
        expect(sortedJson((rec.body as J).input_data), text.slice(0, 200)).toBe(sortedJson(JSON.parse(text).input_data));
      }),
      { numRuns: runs(200), seed: SEED + 1 },
    );
  });

  it('numbers keep their exact text from the request to /input/data.json, the record and input_hash', async () => {
    await fc.assert(
      fc.asyncProperty(exactObject, async ({ sent, canon }) => {
        const text = `{"code":"print(1)","input_data":${sent}}`;
        const r = await check(await request('POST', '/execute/async', { body: text, headers: { 'content-type': 'application/json' } }), `POST /execute/async ${text.slice(0, 200)}`);
        expect(r.status, text.slice(0, 300)).toBe(202);
        noteAccepted(r);
        const id = (r.body as J).job_id as string;
        // The file the program would read: byte for byte the canonical text built here.
        const file = await request('GET', `/jobs/${id}/artifacts/_input.json`);
        expect(await file.text(), text.slice(0, 300)).toBe(canon);
        // The record, read with its numbers kept, is the same value; input_hash hashes that text.
        const res = await request('GET', `/jobs/${id}?view=full`);
        await check(res.clone(), `GET /jobs/${id}`);
        const record = parseJson(await res.text()) as J;
        expect(canonical(record.input_data), text.slice(0, 300)).toBe(canon);
        expect(record.input_hash).toBe(createHash('sha256').update(canon, 'utf8').digest('hex'));
      }),
      { numRuns: runs(200), seed: SEED + 4 },
    );
  });

  it('job paths, queries and conditional headers', async () => {
    // Some real jobs to hit, besides generated ids.
    for (let i = 0; i < 3; i++) {
      const r = await check(await request('POST', '/execute/async', { body: JSON.stringify({ code: `print(${i})` }), headers: { 'content-type': 'application/json' } }), 'seed job');
      noteAccepted(r);
    }
    const ids = [...accepted].slice(0, 5);
    const jobId = fc.oneof(fc.constantFrom(...ids), segment);
    const endpoint = fc.constantFrom(
      ['GET', ''],
      ['GET', '/result'],
      ['POST', '/cancel'],
      ['POST', '/rerun'],
      ['POST', '/fork'],
      ['GET', '/artifacts/'],
      ['HEAD', '/artifacts/'],
    );
    await fc.assert(
      fc.asyncProperty(jobId, endpoint, segment, queryString, fc.option(ifNoneMatch), fc.option(submissionBody), async (id, [method, tail], name, q, inm, body) => {
        const path = `/jobs/${id}${tail}${tail.endsWith('/') ? name : ''}${q ? `?${q}` : ''}`;
        const headers: Record<string, string> = { 'content-type': 'application/json' };
        if (inm !== null) headers['if-none-match'] = inm;
        const r = await check(await request(method!, path, { headers, ...(method === 'POST' && body !== null ? { body } : {}) }), `${method} ${path}`);
        if (tail === '/rerun' || tail === '/fork') noteAccepted(r);
      }),
      { numRuns: runs(600), seed: SEED + 2 },
    );
  });

  it('collections, job types, DLQ, health and documents', async () => {
    const endpoint = fc.constantFrom(
      ['GET', '/executions'],
      ['GET', '/executions/'],
      ['GET', '/job-types'],
      ['GET', '/job-types/'],
      ['POST', '/job-types/', '/build'],
      ['GET', '/dlq'],
      ['GET', '/dlq/stats'],
      ['DELETE', '/dlq/'],
      ['GET', '/health'],
      ['GET', '/livez'],
      ['GET', '/readyz'],
      ['GET', '/pool/stats'],
      ['GET', '/metrics'],
      ['GET', '/openapi.json'],
      ['GET', '/docs'],
      ['PUT', '/executions'],
      ['PATCH', '/jobs/'],
      ['GET', '/'],
    );
    await fc.assert(
      fc.asyncProperty(endpoint, segment, queryString, fc.option(correlationId), async ([method, path, suffix], seg, q, cid) => {
        const full = `${path}${path!.endsWith('/') ? seg : ''}${suffix ?? ''}${q ? `?${q}` : ''}`;
        const headers: Record<string, string> = {};
        if (cid !== null) headers['x-correlation-id'] = cid;
        await check(await request(method!, full, { headers }), `${method} ${full}`);
      }),
      { numRuns: runs(600), seed: SEED + 3 },
    );
  });

  it('every accepted job is a row', async () => {
    expect(accepted.size).toBeGreaterThan(0);
    for (const id of accepted) {
      const res = await request('GET', `/jobs/${id}`);
      expect(res.status, id).toBe(200);
    }
  });
});
