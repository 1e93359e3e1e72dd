/** Reading and validating JSON bodies at the edge, failing as 4xx (413, 415, 400). */
import type { Context } from 'hono';
import * as v from 'valibot';
import { AppError } from '../errors.ts';
import { formatValiIssues } from './errors.ts';
import { incomingOf, requestHeader } from './request-header.ts';

/**
 * The request body as text, at most `limit` bytes (413 beyond). On a real socket it is read straight
 * from Node's IncomingMessage: no web-stream wrapping, and an oversized body is refused from its
 * Content-Length before a byte is read.
 */
export async function readBody(c: Context, limit: number): Promise<string> {
  const tooLarge = () => new AppError('payload_too_large', `request body exceeds ${limit} bytes`);
  const incoming = incomingOf(c);
  if (!incoming) {
    const text = await c.req.text();
    if (Buffer.byteLength(text, 'utf8') > limit) throw tooLarge();
    return text;
  }
  if (Number(incoming.headers['content-length'] ?? 0) > limit) throw tooLarge();
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of incoming as AsyncIterable<Buffer>) {
    total += chunk.length;
    if (total > limit) throw tooLarge();
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, total).toString('utf8');
}

/** Parses the JSON body (415 when not JSON, 400 when malformed, 413 when too large) and validates it. */
export async function jsonBody<S extends v.GenericSchema>(c: Context, schema: S, opts: { optional?: boolean; limit?: number } = {}): Promise<v.InferOutput<S>> {
  const text = await readBody(c, opts.limit ?? DEFAULT_BODY_LIMIT);
  let raw: unknown = {};
  if (text.trim() === '') {
    if (!opts.optional) throw new AppError('bad_request', 'request body is empty; send a JSON object with Content-Type: application/json');
  } else {
    const type = requestHeader(c, 'content-type') ?? '';
    if (!/^application\/(.+\+)?json\b/i.test(type)) {
      throw new AppError('unsupported_media_type', `Content-Type must be application/json, got '${type || '(none)'}'`);
    }
    try {
      raw = JSON.parse(text);
    } catch (err) {
      throw new AppError('bad_request', `request body is not valid JSON: ${(err as Error).message}`);
    }
  }
  return parseOr400(schema, raw, 'request body');
}

/** Body cap when a route gives none (the config's `max_body_bytes` is passed by the routes). */
const DEFAULT_BODY_LIMIT = 2 * 1024 * 1024;

function parseOr400<S extends v.GenericSchema>(schema: S, raw: unknown, what: string): v.InferOutput<S> {
  const r = v.safeParse(schema, raw);
  if (!r.success) throw new AppError('validation_error', formatValiIssues(r.issues) || `invalid ${what}`);
  return r.output;
}
