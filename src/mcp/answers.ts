/**
 * What the MCP tools answer (src/mcp/tools.ts): a run's record cut to what a model needs, with the
 * artifacts as URLs of the API, and a downloaded file as text or base64.
 */
import { createHash } from 'node:crypto';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import type { ExecutionRecordFull } from '../client/index.ts';

/** Bytes of a file given back inline, at most; a larger one is answered with its URL only. */
export const MAX_INLINE_BYTES = 1024 * 1024;

/** A run's or cell's outcome: output, result, error, and each artifact's download URL. */
export function recordSummary(r: ExecutionRecordFull, base: string): Record<string, unknown> {
  const artifactUrl = (name: string) => `${base}/jobs/${encodeURIComponent(r.job_id)}/artifacts/${encodeURIComponent(name)}`;
  return {
    job_id: r.job_id,
    status: r.status,
    success: r.status === 'succeeded',
    exit_code: r.exit_code,
    stdout: r.stdout,
    stderr: r.stderr,
    ...(r.stdout_truncated ? { stdout_truncated: true } : {}),
    ...(r.stderr_truncated ? { stderr_truncated: true } : {}),
    result: r.output ?? null,
    error: r.error ?? null,
    duration_ms: r.duration_ms,
    artifacts: r.artifacts.map((a) => ({
      name: a.name,
      size_bytes: a.size_bytes,
      content_type: a.content_type,
      ...(a.skipped ? { skipped: a.skipped } : { url: artifactUrl(a.name) }),
    })),
    ...(r.artifacts_truncated ? { artifacts_truncated: true, artifacts_total: r.artifacts_total } : {}),
    record_url: `${base}/jobs/${encodeURIComponent(r.job_id)}?view=full`,
  };
}

/** Whether `data` is UTF-8 text a model can read (no NUL, decodes without replacement). */
function asText(data: Buffer): string | null {
  if (data.includes(0)) return null;
  const text = data.toString('utf8');
  return Buffer.byteLength(text, 'utf8') === data.length && !text.includes('\uFFFD') ? text : null;
}

/**
 * A downloaded file as the tool answers it: name, size, sha256, type and URL, plus the content as
 * `text` (UTF-8) or `content_base64`; an image also as MCP image content. Over
 * {@link MAX_INLINE_BYTES} the content is left out (the URL reads it).
 */
export function fileContent(name: string, data: Buffer, contentType: string, url: string): { value: Record<string, unknown>; extra: CallToolResult['content'] } {
  const meta = { name, size_bytes: data.length, sha256: createHash('sha256').update(data).digest('hex'), content_type: contentType, url };
  if (data.length > MAX_INLINE_BYTES) return { value: { ...meta, omitted: `over ${MAX_INLINE_BYTES} bytes: read it from url (with the same bearer token)` }, extra: [] };
  const text = asText(data);
  if (text !== null) return { value: { ...meta, encoding: 'utf8', text }, extra: [] };
  const b64 = data.toString('base64');
  const mime = contentType.split(';')[0]!.trim();
  const extra: CallToolResult['content'] = mime.startsWith('image/') ? [{ type: 'image', data: b64, mimeType: mime }] : [];
  return { value: { ...meta, encoding: 'base64', content_base64: b64 }, extra };
}
