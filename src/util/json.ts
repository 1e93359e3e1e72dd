/**
 * JSON that keeps numbers exactly: parsing, serializing, canonical form and hashing, shared by request
 * bodies, the store, the views, job type digests, idempotency and input hashes.
 *
 * `JSON.parse` turns every number into an IEEE double, so an integer beyond 2^53 or a decimal with
 * more digits than a double holds comes back changed, and `1.0` becomes `1` (which a Python program
 * then reads as an int instead of a float). Node 20 has no `JSON.parse` source-text access, so numbers
 * that a double cannot spell exactly are parsed with `lossless-json` into its `LosslessNumber` (the
 * number's text) and written back verbatim by {@link stringifyJson}. A number whose text is exactly
 * how JavaScript spells the double (`42`, `0.5`, `-3e-7`) stays a plain `number`, so ordinary values
 * are ordinary JavaScript and only the rare exact ones are objects.
 */
import { createHash } from 'node:crypto';
import { isLosslessNumber, LosslessNumber, parse as parseLossless, stringify as stringifyLossless } from 'lossless-json';

export { isLosslessNumber as isExactNumber, LosslessNumber as ExactNumber };

/**
 * How deeply a JSON value we store may nest: `input_data` deeper than this is a 400, a result.json
 * deeper than this a `json_error`. Python's json module (what programs read and write JSON with)
 * gives up near 1,000 levels, and every layer that copies or serializes a value recurses: 512 is far
 * beyond real data and safely inside every parser on the way.
 */
export const MAX_JSON_DEPTH = 512;

/**
 * The deepest document {@link parseJson} reads: a value of {@link MAX_JSON_DEPTH} levels inside the
 * object that carries it (a request body, a DLQ entry). The exact parser recurses, so a deeper
 * document is refused before it runs.
 */
export const MAX_DOCUMENT_DEPTH = MAX_JSON_DEPTH + 1;

/** A document nests deeper than {@link MAX_DOCUMENT_DEPTH}; `value` is its plain (`JSON.parse`) reading. */
export class JsonDepthError extends Error {
  override readonly name = 'JsonDepthError';
  constructor(readonly value: unknown) {
    super(`JSON nests deeper than ${MAX_DOCUMENT_DEPTH} levels`);
  }
}

/**
 * Parses JSON text keeping every number's value: a number whose text JavaScript would spell the same
 * way is a `number`, any other (`12345678901234567890`, `0.10000000000000000001`, `1.0`, `1e2`, `-0`)
 * an {@link ExactNumber} holding the text. Otherwise as `JSON.parse`: the same syntax errors
 * (`SyntaxError`), the last of duplicate keys wins, `__proto__` is an own key. Throws
 * {@link JsonDepthError} for a document deeper than {@link MAX_DOCUMENT_DEPTH}.
 */
export function parseJson(text: string): unknown {
  const plain: unknown = JSON.parse(text);
  if (plain === null || typeof plain !== 'object') {
    if (typeof plain !== 'number') return plain;
    return exactNumber(text.trim());
  }
  if (jsonDepth(plain, MAX_DOCUMENT_DEPTH) > MAX_DOCUMENT_DEPTH) throw new JsonDepthError(plain);
  // Text already in JavaScript's own spelling (what our own writers store) holds no number a double
  // changes: the plain reading is the exact one, at native speed.
  if (JSON.stringify(plain) === text) return plain;
  return parseLossless(text, null, { parseNumber: exactNumber, onDuplicateKey: ({ newValue }) => newValue });
}

/**
 * JSON text of a value, numbers from {@link parseJson} written as they were read. Otherwise as
 * `JSON.stringify` (lone surrogates as `\u` escapes, `undefined` members left out).
 */
export function stringifyJson(value: unknown): string {
  return holdsExactNumber(value) ? (stringifyLossless(value) as string) : JSON.stringify(value);
}

/**
 * A copy of a parsed value with every {@link ExactNumber} turned into the double `JSON.parse` would
 * have given, for fields that are numbers to the service itself (a timeout), not data it carries.
 */
export function toPlain(value: unknown): unknown {
  if (isLosslessNumber(value)) return Number(value.value);
  if (Array.isArray(value)) return value.map(toPlain);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) Object.defineProperty(out, k, { value: toPlain(v), enumerable: true, writable: true, configurable: true });
    return out;
  }
  return value;
}

/**
 * Canonical JSON: object keys sorted at every level, no whitespace, strings as `JSON.stringify`
 * writes them, numbers exactly as sent. Equal texts give equal strings; so do the same values sent
 * with other key orders or spacing. Numbers are not normalized: `1.0` and `1`, `1e2` and `100` are
 * different (a Python program reads a float for one and an int for the other). Every key is kept as
 * data, `__proto__`, `constructor` and `prototype` included.
 */
export function canonical(value: unknown): string {
  return stringifyJson(sortKeys(value));
}

/** sha256 hex of a string (UTF-8) or bytes. */
export function sha256(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

function exactNumber(text: string): number | LosslessNumber {
  const n = Number(text);
  return String(n) === text ? n : new LosslessNumber(text);
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === 'object' && !isLosslessNumber(value)) {
    // A prototype-less object: assigning `__proto__` makes an own key instead of a prototype.
    const out: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
    for (const k of Object.keys(value as object).sort()) out[k] = sortKeys((value as Record<string, unknown>)[k]);
    return out;
  }
  return value;
}

/** Whether an exact number is anywhere in `value` (walked without recursion). */
function holdsExactNumber(value: unknown): boolean {
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (v === null || typeof v !== 'object') continue;
    if (isLosslessNumber(v)) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v as object)) {
      if (child !== null && typeof child === 'object') stack.push(child);
    }
  }
  return false;
}

/**
 * How deeply a parsed JSON value nests (a scalar is 0, `[]` and `{}` are 1), counted without
 * recursion so any depth a request body can hold is measured safely. Stops counting past `cap`.
 */
export function jsonDepth(value: unknown, cap = Infinity): number {
  let max = 0;
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== 'object' || isLosslessNumber(v)) continue;
    const depth = d + 1;
    if (depth > max) max = depth;
    if (max > cap) return max;
    for (const child of Array.isArray(v) ? v : Object.values(v as object)) {
      if (child !== null && typeof child === 'object') stack.push([child, depth]);
    }
  }
  return max;
}
