/**
 * Input and output fidelity through the whole service (issue #9), on the real sandbox and the
 * database under test (PostgreSQL, and PGlite in `make test`'s second pass):
 * - any JSON input reaches /input/data.json and the record as the same value — NUL and other
 *   control characters, lone surrogates, `__proto__`/`constructor`/`prototype` keys;
 * - what a program prints or writes is stored and returned by one rule: bytes decoded as UTF-8 with
 *   invalid sequences as U+FFFD, NUL kept (as `\u0000` in JSON); the program decides the status;
 * - numbers keep their exact text (beyond 2^53, more digits than a double, `1.0`, `1e2`, `-0`) from
 *   the request to /input/data.json, the record, every view and the DLQ, and from result.json back.
 */
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseJson, stringifyJson } from '../../../src/util/json.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { withRun } from '../../support/runtime-wrap.ts';

type J = Record<string, any>;

/** Python that echoes its input back, as result.json and on stdout. */
const ECHO = [
  'import json, sys',
  'data = json.load(open("/input/data.json"))',
  'json.dump(data, open("/output/result.json", "w"))',
  'sys.stdout.write(json.dumps(data))',
].join('\n');

/** Marks code whose run meets an unreachable engine (see the runtime wrapper below). */
const ENGINE_DOWN = '# engine-down';

/**
 * Numbers a double cannot hold, or spells another way, in canonical form (keys sorted, no spaces):
 * exactly the text /input/data.json must hold, and what `input_hash` is the SHA-256 of.
 */
const NUMBERS_CANONICAL =
  '{"arr":[9007199254740993,-1.5e-400,2.5],"big":12345678901234567890,"dec":0.1000000000000000055511151231257827,"exp":1e2,"float1":1.0,"huge":1e400,"neg":-98765432109876543210987,"negzero":-0,"nested":{"__proto__":{"n":123456789012345678901234567890}},"small":42}';
/** The same value as a client might send it: other key order, spaces, an escaped key. */
const NUMBERS_SENT =
  '{ "small": 42, "neg": -98765432109876543210987, "big": 12345678901234567890, "float1": 1.0, "exp": 1e2,\n "dec": 0.1000000000000000055511151231257827, "huge": 1e400, "negzero": -0, "arr": [ 9007199254740993, -1.5e-400, 2.5 ], "nested": {"\\u005f_proto__": {"n": 123456789012345678901234567890}} }';

/**
 * Python reading the input: the file's exact text, then each number as Python sees it (`Decimal` for
 * the decimals, to print every digit; the plain reading's type, so `1.0` is a float and `42` an int),
 * and a result.json made of numbers Python computed with arbitrary precision.
 */
const NUMBERS_CODE = [
  'import decimal, json, sys',
  'raw = open("/input/data.json").read()',
  'exact = json.loads(raw, parse_float=decimal.Decimal)',
  'plain = json.loads(raw)',
  'print(raw)',
  'for k in ["big", "neg", "dec", "float1", "exp", "small"]:',
  '    print(k, exact[k], type(plain[k]).__name__)',
  'print("arr0", exact["arr"][0], "nested", exact["nested"]["__proto__"]["n"])',
  'json.dump({"big": plain["big"], "big10": plain["big"] * 10, "f": plain["float1"], "pow": 2 ** 100, "neg": -(2 ** 64) - 1}, open("/output/result.json", "w"))',
].join('\n');

/** What NUMBERS_CODE prints for NUMBERS_CANONICAL. */
const NUMBERS_STDOUT = [
  NUMBERS_CANONICAL,
  'big 12345678901234567890 int',
  'neg -98765432109876543210987 int',
  'dec 0.1000000000000000055511151231257827 float',
  'float1 1.0 float',
  'exp 1E+2 float',
  'small 42 int',
  'arr0 9007199254740993 nested 123456789012345678901234567890',
  '',
].join('\n');

/** The result.json NUMBERS_CODE writes, as the service keeps it (Python's spaces dropped, key order kept). */
const NUMBERS_RESULT = `{"big":12345678901234567890,"big10":123456789012345678900,"f":1.0,"pow":${2n ** 100n},"neg":${-(2n ** 64n) - 1n}}`;

const sha256 = (s: string) => createHash('sha256').update(s, 'utf8').digest('hex');

describe('fidelity of inputs and outputs', () => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService(
      { max_stdout_bytes: 4096 },
      {
        // Code carrying ENGINE_DOWN meets an unreachable engine (twice: the retry too) and lands in the DLQ.
        runtime: async (real) => {
          const r = await real();
          return withRun(r, (spec, opts) =>
            spec.code.includes(ENGINE_DOWN) ? Promise.reject(Object.assign(new Error('connect ECONNREFUSED /run/engine.sock'), { code: 'ECONNREFUSED' })) : r.run(spec, opts),
          );
        },
      },
    );
  });
  afterAll(async () => {
    await svc?.close();
  });

  async function run(body: J | string): Promise<J> {
    const res = await svc.post('/execute', body);
    expect(res.status, await res.clone().text()).toBe(200);
    const sync = (await res.json()) as J;
    const rec = await svc.get(`/executions/${sync.execution_id}?view=full`);
    expect(rec.status).toBe(200);
    return { sync, record: (await rec.json()) as J };
  }

  it('control characters, NUL, lone surrogates and prototype-like keys reach the program and the record', async () => {
    // Written as JSON text: a JavaScript object literal could not hold the __proto__ key.
    const inputText = '{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}},"prototype":[],"nul":"a\\u0000b","c0":"\\u0001\\u001f\\u007f","lone":"\\ud800x\\udfff","astral":"😀","sep":"\\u2028\\u2029"}';
    const expected = JSON.parse(inputText) as J;
    const { sync, record } = await run(`{"code":${JSON.stringify(ECHO)},"input_data":${inputText}}`);
    expect(sync.success, sync.stderr).toBe(true);
    // The program read the same value (json.load in Python), and returned it unchanged.
    expect(sync.output).toEqual(expected);
    expect(Object.keys(sync.output)).toContain('__proto__');
    expect(JSON.parse(sync.stdout)).toEqual(expected);
    // The record keeps it too, in every view, with a stable hash.
    expect(record.input_data).toEqual(expected);
    expect(Object.keys(record.input_data)).toContain('__proto__');
    const again = await run(`{"code":${JSON.stringify(ECHO)},"input_data":${inputText}}`);
    expect(again.record.input_hash).toBe(record.input_hash);
    const artifact = await svc.get(`/jobs/${record.execution_id}/artifacts/_input.json`);
    expect(JSON.parse(await artifact.text())).toEqual(expected);
  });

  it('input nested deeper than the documented limit is a 400 naming the field', async () => {
    const deep = `${'['.repeat(600)}${']'.repeat(600)}`;
    const res = await svc.post('/execute', `{"code":"print(1)","input_data":{"x":${deep}}}`);
    expect(res.status).toBe(400);
    expect(((await res.json()) as J).detail).toMatch(/input_data.*512 levels/);
    // Any field: the body is read with its numbers exact, which bounds the depth of all of it.
    const extra = await svc.post('/execute', `{"code":"print(1)","extra":${'['.repeat(5000)}${']'.repeat(5000)},"input_data":{"n":12345678901234567890}}`);
    expect(extra.status).toBe(400);
    expect(((await extra.json()) as J).detail).toBe('extra must nest at most 512 levels deep (it nests deeper)');
    const ok = `${'['.repeat(500)}${']'.repeat(500)}`;
    const { sync } = await run(`{"code":"import json; json.load(open('/input/data.json')); print('read')","input_data":{"x":${ok}}}`);
    expect(sync.stdout).toBe('read\n');
  });

  it('code with a lone surrogate is a 400, not a silently changed program', async () => {
    const res = await svc.post('/execute', '{"code":"print(\\"\\ud800\\")"}');
    expect(res.status).toBe(400);
    expect(((await res.json()) as J).detail).toMatch(/code must be valid Unicode/);
  });

  it('NUL and invalid UTF-8 on stdout and stderr are kept by the rule; the program decides the status', async () => {
    const code = [
      'import sys',
      'sys.stdout.write("a\\x00b\\n")',
      'sys.stdout.flush()',
      'sys.stdout.buffer.write(b"bad:\\xff\\xfe|half:\\xe2\\x82|end\\n")',
      'sys.stderr.buffer.write(b"err\\x00\\xc3\\x28\\n")',
    ].join('\n');
    const { sync, record } = await run({ code });
    expect(sync.success).toBe(true);
    expect(record.status).toBe('succeeded');
    expect(sync.stdout).toBe('a\u0000b\nbad:\ufffd\ufffd|half:\ufffd|end\n');
    expect(record.stdout).toBe(sync.stdout);
    expect(sync.stderr).toBe('err\u0000\ufffd(\n');
  });

  it('one enormous line is cut at max_stdout_bytes and flagged', async () => {
    const { sync, record } = await run({ code: 'import sys\nsys.stdout.write("x" * 1_000_000)\nsys.stderr.write("y" * 10)' });
    expect(sync.success).toBe(true);
    expect(Buffer.byteLength(record.stdout, 'utf8')).toBeLessThanOrEqual(4096);
    expect(record.stdout).toMatch(/^x+/);
    expect(record.stdout_truncated).toBe(true);
    expect(record.stderr).toBe('yyyyyyyyyy');
    expect(record.stderr_truncated).toBe(false);
  });

  it('result.json with NUL, lone surrogates and control characters round-trips', async () => {
    const code = 'import json\njson.dump({"nul": "a\\x00b", "lone": "\\ud800", "c": "\\x01", "__proto__": 1}, open("/output/result.json", "w"))';
    const { sync, record } = await run({ code });
    expect(sync.success, sync.stderr).toBe(true);
    const expected = JSON.parse('{"nul":"a\\u0000b","lone":"\\ud800","c":"\\u0001","__proto__":1}') as J;
    expect(sync.output).toEqual(expected);
    expect(record.output).toEqual(expected);
  });

  it('a result.json nested deeper than the limit fails the run with json_error, not internal_error', async () => {
    const code = 'open("/output/result.json", "w").write("[" * 20000 + "]" * 20000)';
    const { sync, record } = await run({ code });
    expect(record.status).toBe('failed');
    expect(sync.error.type).toBe('json_error');
    expect(sync.error.message).toMatch(/512/);
  });

  it('artifact names and bytes survive: Unicode names, NUL bytes, invalid UTF-8', async () => {
    const code = [
      'open("/output/données été.bin", "wb").write(bytes(range(256)) * 4)',
      'open("/output/nul.txt", "wb").write(b"a\\x00b\\xff")',
    ].join('\n');
    const { record } = await run({ code });
    expect(record.status).toBe('succeeded');
    const names = (record.artifacts as J[]).map((a) => a.name).sort();
    expect(names).toEqual(['données été.bin', 'nul.txt']);
    const bin = await svc.get(`/jobs/${record.execution_id}/artifacts/${encodeURIComponent('données été.bin')}`);
    expect(bin.status).toBe(200);
    const bytes = Buffer.from(await bin.arrayBuffer());
    expect(bytes.equals(Buffer.concat(Array.from({ length: 4 }, () => Buffer.from(Array.from({ length: 256 }, (_, i) => i)))))).toBe(true);
    const nul = await svc.get(`/jobs/${record.execution_id}/artifacts/nul.txt`);
    expect(Buffer.from(await nul.arrayBuffer()).equals(Buffer.from([0x61, 0, 0x62, 0xff]))).toBe(true);
  });
  /** A JSON answer read with its numbers kept exactly. */
  async function exact(res: Response | Promise<Response>, status = 200): Promise<J> {
    const r = await res;
    const text = await r.text();
    expect(r.status, text.slice(0, 300)).toBe(status);
    return parseJson(text) as J;
  }

  it('large and precise numbers reach the program and come back exactly, in every view', async () => {
    const body = `{"code":${JSON.stringify(NUMBERS_CODE)},"input_data":${NUMBERS_SENT}}`;
    const sync = await exact(svc.post('/execute', body));
    expect(sync.success, sync.stderr).toBe(true);
    // The program read every digit, and the file holds exactly the canonical text.
    expect(sync.stdout).toBe(NUMBERS_STDOUT);
    // Its result.json: Python's big integers and 1.0 come back as written.
    expect(stringifyJson(sync.output)).toBe(NUMBERS_RESULT);
    const id = sync.execution_id as string;

    const views: [string, J][] = [
      ['GET /executions/{id}?view=full', await exact(svc.get(`/executions/${id}?view=full`))],
      ['GET /jobs/{id}?view=full', await exact(svc.get(`/jobs/${id}?view=full`))],
      ['GET /jobs/{id}/result?view=full', await exact(svc.get(`/jobs/${id}/result?view=full`))],
      ['GET /executions?view=full', ((await exact(svc.get('/executions?view=full&limit=1000'))).items as J[]).find((r) => r.execution_id === id)!],
    ];
    for (const [what, record] of views) {
      expect(record, what).toBeDefined();
      expect(stringifyJson(record.input_data), what).toBe(NUMBERS_CANONICAL);
      expect(stringifyJson(record.output), what).toBe(NUMBERS_RESULT);
      expect(record.input_hash, what).toBe(sha256(NUMBERS_CANONICAL));
    }
    // Summary views carry the output too.
    expect(stringifyJson((await exact(svc.get(`/jobs/${id}/result`))).output)).toBe(NUMBERS_RESULT);
    // The raw answer spells the numbers (not strings, not rounded doubles).
    const text = await (await svc.get(`/executions/${id}?view=full`)).text();
    expect(text).toContain('"big":12345678901234567890,');
    expect(text).toContain('"big10":123456789012345678900,');
    expect(text).toContain('"float1":1.0,');
    const artifact = await svc.get(`/jobs/${id}/artifacts/_input.json`);
    expect(await artifact.text()).toBe(NUMBERS_CANONICAL);

    // The same value sent again (here already canonical) has the same hash.
    const again = await exact(svc.post('/execute', `{"code":"print(1)","input_data":${NUMBERS_CANONICAL}}`));
    const againRecord = await exact(svc.get(`/executions/${again.execution_id}?view=full`));
    expect(againRecord.input_hash).toBe(sha256(NUMBERS_CANONICAL));
  });

  it('numbers that one double cannot tell apart are different inputs and different payloads', async () => {
    // 12345678901234567890 and 12345678901234567891 are the same double; 1.0 and 1 the same number.
    const key = `exact-${Date.now()}`;
    const submit = (input: string) => svc.post('/execute/async', `{"code":"print(1)","idempotency_key":"${key}","input_data":${input}}`);
    const first = await exact(submit('{"n":12345678901234567890,"f":1.0}'), 202);
    const replay = await exact(submit('{ "f": 1.0, "n": 12345678901234567890 }'), 200);
    expect(replay).toMatchObject({ job_id: first.job_id, created: false });
    for (const other of ['{"n":12345678901234567891,"f":1.0}', '{"n":12345678901234567890,"f":1}', '{"n":12345678901234567890.0,"f":1.0}']) {
      const conflict = await exact(submit(other), 409);
      expect(conflict, other).toMatchObject({ code: 'idempotency_conflict', existing_job_id: first.job_id });
    }
    const a = await exact(svc.get(`/jobs/${first.job_id}?view=full`));
    expect(stringifyJson(a.input_data)).toBe('{"f":1.0,"n":12345678901234567890}');
    const b = await exact(svc.post('/execute/async', '{"code":"print(1)","input_data":{"n":12345678901234567891,"f":1.0}}'), 202);
    const bRecord = await exact(svc.get(`/jobs/${b.job_id}?view=full`));
    expect(bRecord.input_hash).not.toBe(a.input_hash);
    expect(bRecord.input_hash).toBe(sha256('{"f":1.0,"n":12345678901234567891}'));
  });

  it('rerun and fork carry the exact input; a DLQ entry keeps it too', async () => {
    const first = await exact(svc.post('/execute', `{"code":"print(1)","input_data":${NUMBERS_SENT}}`));
    for (const how of ['rerun', 'fork']) {
      const derived = await exact(svc.post(`/jobs/${first.execution_id}/${how}`, how === 'fork' ? { code: 'print(2)' } : undefined), 202);
      const record = await exact(svc.get(`/jobs/${derived.job_id}?view=full`));
      expect(stringifyJson(record.input_data), how).toBe(NUMBERS_CANONICAL);
      expect(record.input_hash, how).toBe(sha256(NUMBERS_CANONICAL));
    }
    const failed = await exact(svc.post('/execute', `{"code":"print(1) ${ENGINE_DOWN}","input_data":${NUMBERS_SENT}}`));
    expect(failed.error.type).toBe('internal_error');
    const dlq = await exact(svc.get('/dlq?error_type=internal_error&limit=1000'));
    const entry = (dlq.items as J[]).find((e) => e.job_id === failed.execution_id);
    expect(entry).toBeDefined();
    expect(stringifyJson(entry!.job_data.input_data)).toBe(NUMBERS_CANONICAL);
  });

  it('a number alone as input_data is a 400; the service reads its own numbers (timeout) as numbers', async () => {
    const scalar = await exact(svc.post('/execute', '{"code":"print(1)","input_data":12345678901234567890}'), 400);
    expect(scalar.detail).toMatch(/input_data must be a JSON object/);
    // The service reads its own numbers as numbers: timeout 30.0 and 3e1 are 30 seconds.
    for (const t of ['30.0', '3e1']) {
      const ok = await exact(svc.post('/execute/async', `{"code":"print(1)","timeout":${t},"input_data":{"t":${t}}}`), 202);
      const record = await exact(svc.get(`/jobs/${ok.job_id}?view=full`));
      expect(record.timeout, t).toBe(30);
      expect(stringifyJson(record.input_data), t).toBe(`{"t":${t}}`);
    }
  });
});
