/**
 * Input and output fidelity through the whole service (issue #9), on the real sandbox and the
 * database under test (PostgreSQL, and PGlite in `make test`'s second pass):
 * - any JSON input reaches /input/data.json and the record as the same value — NUL and other
 *   control characters, lone surrogates, `__proto__`/`constructor`/`prototype` keys;
 * - what a program prints or writes is stored and returned by one rule: bytes decoded as UTF-8 with
 *   invalid sequences as U+FFFD, NUL kept (as `\u0000` in JSON); the program decides the status.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;

/** Python that echoes its input back, as result.json and on stdout. */
const ECHO = [
  'import json, sys',
  'data = json.load(open("/input/data.json"))',
  'json.dump(data, open("/output/result.json", "w"))',
  'sys.stdout.write(json.dumps(data))',
].join('\n');

describe('fidelity of inputs and outputs', () => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService({ max_stdout_bytes: 4096 });
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
});
