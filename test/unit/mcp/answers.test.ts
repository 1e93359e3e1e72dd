/**
 * The MCP tools' answers (src/mcp/answers.ts): a downloaded file comes back as text only when it is
 * UTF-8 without NUL, else as base64 (an image also as image content), and over the inline bound as its
 * URL alone; a record's artifacts become URLs of the API except skipped ones; API refusals become tool
 * errors with the API's words.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { SandpodConnectionError, SandpodError, type ExecutionRecordFull } from '../../../src/client/index.ts';
import { fileContent, MAX_INLINE_BYTES, recordSummary } from '../../../src/mcp/answers.ts';
import { toolError } from '../../../src/mcp/tools.ts';

describe('fileContent', () => {
  const url = 'http://h/sessions/s/files/f';
  it('gives UTF-8 text as text, with size and sha256', () => {
    const { value, extra } = fileContent('a.txt', Buffer.from('héllo\n'), 'text/plain', url);
    expect(value).toMatchObject({ name: 'a.txt', size_bytes: 7, encoding: 'utf8', text: 'héllo\n', url });
    expect(value.sha256).toBe(createHash('sha256').update('héllo\n').digest('hex'));
    expect(extra).toEqual([]);
  });

  it('gives bytes that are not UTF-8, or hold NUL, as base64; an image also as image content', () => {
    const bin = Buffer.from([0xff, 0xfe, 0x00, 0x41]);
    expect(fileContent('b.bin', bin, 'application/octet-stream', url).value).toMatchObject({ encoding: 'base64', content_base64: bin.toString('base64') });
    expect(fileContent('nul.txt', Buffer.from('a\0b'), 'text/plain', url).value.encoding).toBe('base64');
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    const { extra } = fileContent('p.png', png, 'image/png; charset=binary', url);
    expect(extra).toEqual([{ type: 'image', data: png.toString('base64'), mimeType: 'image/png' }]);
  });

  it('leaves out the content of a file over the inline bound', () => {
    const { value } = fileContent('big', Buffer.alloc(MAX_INLINE_BYTES + 1, 0x61), 'text/plain', url);
    expect(value).toMatchObject({ size_bytes: MAX_INLINE_BYTES + 1, url });
    expect(value.text).toBeUndefined();
    expect(value.omitted).toContain('read it from url');
    expect(fileContent('edge', Buffer.alloc(MAX_INLINE_BYTES, 0x61), 'text/plain', url).value.text).toHaveLength(MAX_INLINE_BYTES);
  });
});

describe('recordSummary', () => {
  it('lists artifacts as API URLs (names encoded), skipped ones without a URL', () => {
    const r = {
      job_id: 'j1', status: 'succeeded', exit_code: 0, stdout: 'o', stderr: '', stdout_truncated: false, stderr_truncated: true, output: { a: 1 }, error: null, duration_ms: 12,
      artifacts: [
        { name: 'a b.txt', size_bytes: 3, sha256: 'x', content_type: 'text/plain' },
        { name: 'huge', size_bytes: 9, sha256: 'y', content_type: 'application/octet-stream', skipped: 'too_large' },
      ],
      artifacts_truncated: false, artifacts_total: 2,
    } as unknown as ExecutionRecordFull;
    const s = recordSummary(r, 'https://svc.example');
    expect(s).toMatchObject({ job_id: 'j1', success: true, result: { a: 1 }, stderr_truncated: true, record_url: 'https://svc.example/jobs/j1?view=full' });
    expect(s.stdout_truncated).toBeUndefined();
    expect(s.artifacts).toEqual([
      { name: 'a b.txt', size_bytes: 3, content_type: 'text/plain', url: 'https://svc.example/jobs/j1/artifacts/a%20b.txt' },
      { name: 'huge', size_bytes: 9, content_type: 'application/octet-stream', skipped: 'too_large' },
    ]);
  });
});

describe('toolError', () => {
  it('says the API\'s detail, code and status, and the body\'s other facts', () => {
    const e = toolError(new SandpodError(409, { detail: 'a cell is running', code: 'conflict', correlation_id: 'c', running_cell_id: 'r1' }));
    expect(e.isError).toBe(true);
    expect(e.content).toEqual([{ type: 'text', text: 'a cell is running [conflict] (HTTP 409)\n{"running_cell_id":"r1"}' }]);
    expect(toolError(new SandpodConnectionError('http://x', new Error('connect ECONNREFUSED'))).content[0]).toMatchObject({ text: 'cannot reach the service at http://x: connect ECONNREFUSED' });
  });
});
