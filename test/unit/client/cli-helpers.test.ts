/**
 * The CLI's pure decisions: the exit code of a finished run, the submission text (input spliced in
 * exactly as written), --input parsing, and the one error line with its exit code.
 */
import { describe, expect, it } from 'vitest';
import { SandpodConnectionError, SandpodError } from '../../../src/client/index.ts';
import { readInput, submissionText } from '../../../src/cli/main.ts';
import { describeError, EXIT, exitCodeOf, UsageError } from '../../../src/cli/output.ts';

describe('exitCodeOf', () => {
  it.each([
    ['succeeded', 0, 0],
    ['failed', 3, 3],
    ['failed', 256 + 7, 7],
    ['failed', 256, 1],
    ['failed', null, 1],
    ['failed', 0, 1],
    ['timeout', null, 124],
    ['oom', 137, 137],
    ['oom', null, 137],
    ['cancelled', null, 130],
  ] as const)('%s with exit code %s → %i', (status, exit_code, want) => {
    expect(exitCodeOf({ status, exit_code })).toBe(want);
  });
});

describe('submissionText', () => {
  it('keeps the input text as written: big and long-decimal numbers are not rounded', () => {
    const input = '{"n": 12345678901234567890123, "x": 0.1000000000000000055511151231257827}';
    const text = submissionText({ code: 'print(1)', timeout: 5 }, input);
    expect(text).toContain('"input_data":{"n": 12345678901234567890123, "x": 0.1000000000000000055511151231257827}');
    expect(JSON.parse(text)).toMatchObject({ code: 'print(1)', timeout: 5 });
  });
  it('is the fields alone without input, and input alone without fields', () => {
    expect(submissionText({ code: 'x' }, null)).toBe('{"code":"x"}');
    expect(submissionText({}, '{}')).toBe('{"input_data":{}}');
  });
});

describe('readInput', () => {
  it('accepts a JSON object or null, refuses other JSON and invalid text', () => {
    expect(readInput(' {"a": 1} ')).toBe('{"a": 1}');
    expect(readInput('null')).toBe('null');
    expect(() => readInput('[1]')).toThrow(UsageError);
    expect(() => readInput('3')).toThrow(/must be a JSON object/);
    expect(() => readInput('{"a":')).toThrow(/not valid JSON/);
    expect(() => readInput('@/nonexistent/file.json')).toThrow(/ENOENT/);
  });
});

describe('describeError', () => {
  it('one line with detail and code for an error body (exit 3), a token hint on 401', () => {
    const e = new SandpodError(404, { detail: "job 'x'\nnot found", code: 'not_found', correlation_id: 'c' });
    expect(describeError(e)).toEqual({ line: "job 'x' not found [not_found]", code: EXIT.service });
    const a = describeError(new SandpodError(401, { detail: 'missing bearer token', code: 'unauthorized' }));
    expect(a.line).toBe('missing bearer token [unauthorized] (pass --token or set SANDPOD_TOKEN)');
  });
  it('a body that is not the error body still says the status', () => {
    expect(describeError(new SandpodError(502, null, 'HTTP 502 Bad Gateway')).line).toBe('HTTP 502 Bad Gateway [http_502]');
  });
  it('unreachable: the address and the reason (exit 3); usage errors exit 2', () => {
    const cause = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9'), { code: 'ECONNREFUSED' });
    const r = describeError(new SandpodConnectionError('http://127.0.0.1:9', new TypeError('fetch failed', { cause })));
    expect(r).toEqual({ line: 'cannot reach the service at http://127.0.0.1:9: connect ECONNREFUSED 127.0.0.1:9 (is it running? set --url or SANDPOD_URL)', code: EXIT.service });
    expect(describeError(new UsageError('bad'))).toEqual({ line: 'bad', code: EXIT.usage });
  });
});
