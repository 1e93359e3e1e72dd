/** Reading and validating JSON bodies at the edge, failing as 4xx (413, 415, 400). */
import type { Context } from 'hono';
import * as v from 'valibot';
import { AppError } from '../errors.ts';
import { jsonDepth, JsonDepthError, MAX_JSON_DEPTH, parseJson, toPlain } from '../util/json.ts';
import { formatValiIssues } from './errors.ts';
import { incomingOf, requestHeader } from './request-header.ts';

/**
 * The request body as text, at most `limit` bytes (413 beyond, naming max_body_bytes): see
 * {@link readBodyBytes}.
 */
export async function readBody(c: Context, limit: number): Promise<string> {
  const tooLarge = () => new AppError('payload_too_large', `request body exceeds ${limit} bytes (max_body_bytes)`);
  return (await readBodyBytes(c, limit, tooLarge)).toString('utf8');
}

/**
 * The request body's bytes, at most `limit` (`tooLarge()` is thrown beyond). On a real socket it is
 * read straight from Node's IncomingMessage: no web-stream wrapping, and an oversized body is refused
 * from its Content-Length before a byte is read. Listeners, not `for await`: leaving a `for await`
 * early destroys the stream (and the socket with it), so the 413 could not be read by the client;
 * here the rest is left to the clean-up of middleware/body-rules.ts, which discards it and keeps the
 * connection. (Touching `c.req.raw.body` first, as hono's bodyLimit does, wraps the socket in a web
 * stream nobody reads: that clean-up can then not drain it, the next request on the connection is
 * never read, and the keep-alive timer resets the connection under the client.)
 */
export async function readBodyBytes(c: Context, limit: number, tooLarge: () => Error): Promise<Buffer> {
  const incoming = incomingOf(c);
  if (!incoming) {
    const data = Buffer.from(await c.req.arrayBuffer());
    if (data.length > limit) throw tooLarge();
    return data;
  }
  if (Number(incoming.headers['content-length'] ?? 0) > limit) throw tooLarge();
  if (incoming.readableEnded) return Buffer.alloc(0);
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let total = 0;
    const settle = (err: Error | null) => {
      incoming.off('data', onData);
      incoming.off('end', onEnd);
      incoming.off('error', onError);
      incoming.off('close', onClose);
      if (err) {
        incoming.pause();
        reject(err);
      } else resolve(Buffer.concat(chunks, total));
    };
    const onData = (chunk: Buffer) => {
      total += chunk.length;
      if (total > limit) settle(tooLarge());
      else chunks.push(chunk);
    };
    const onEnd = () => settle(null);
    const onError = (err: Error) => settle(new AppError('bad_request', `request body could not be read: ${err.message}`));
    const onClose = () => {
      if (!incoming.complete) settle(new AppError('bad_request', 'the client closed the connection before the request body was complete'));
    };
    incoming.on('data', onData);
    incoming.once('end', onEnd);
    incoming.once('error', onError);
    incoming.once('close', onClose);
  });
}

/**
 * Top-level body fields that are the client's data, carried to the program and back: their numbers
 * are kept exactly (SPEC §2.1 `input_data`).
 */
export const EXACT_FIELDS: readonly string[] = ['input_data'];

/**
 * Parses the JSON body (415 when not JSON, 400 when malformed or nested deeper than the limit, 413
 * when too large) and validates it. Numbers are read exactly ({@link parseJson}) in the top-level
 * fields named by `exact` ({@link EXACT_FIELDS} unless given); everywhere else they are the doubles
 * `JSON.parse` gives, since the service itself reads them (a timeout of `30.0` is 30).
 */
export async function jsonBody<S extends v.GenericSchema>(
  c: Context,
  schema: S,
  opts: { optional?: boolean; limit?: number; exact?: readonly string[] } = {},
): Promise<v.InferOutput<S>> {
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
      raw = parseJson(text);
    } catch (err) {
      if (err instanceof JsonDepthError) throw tooDeep(err.value);
      throw new AppError('bad_request', `request body is not valid JSON: ${(err as Error).message}`);
    }
    raw = plainExcept(raw, opts.exact ?? EXACT_FIELDS);
  }
  return parseOr400(schema, raw, 'request body');
}

/** The 400 of a body nested deeper than any field may: it names the fields that do. */
function tooDeep(body: unknown): AppError {
  const fields =
    body !== null && typeof body === 'object' && !Array.isArray(body)
      ? Object.entries(body).filter(([, value]) => jsonDepth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH).map(([k]) => k)
      : [];
  const what = fields.length > 0 ? fields.join(', ') : 'request body';
  return new AppError('validation_error', `${what} must nest at most ${MAX_JSON_DEPTH} levels deep (it nests deeper)`);
}

/** The body with its exact numbers turned plain outside the top-level fields named in `exact`. */
function plainExcept(body: unknown, exact: readonly string[]): unknown {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return toPlain(body);
  const out: Record<string, unknown> = {};
  for (const [k, value] of Object.entries(body)) {
    Object.defineProperty(out, k, { value: exact.includes(k) ? value : toPlain(value), enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/** Body cap when a route gives none (the config's `max_body_bytes` is passed by the routes). */
const DEFAULT_BODY_LIMIT = 2 * 1024 * 1024;

function parseOr400<S extends v.GenericSchema>(schema: S, raw: unknown, what: string): v.InferOutput<S> {
  const r = v.safeParse(schema, raw);
  if (!r.success) throw new AppError('validation_error', formatValiIssues(r.issues) || `invalid ${what}`);
  return r.output;
}
