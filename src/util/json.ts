/** Canonical JSON and hashing, shared by job type digests, idempotency and input hashes. */
import { createHash } from 'node:crypto';

/**
 * JSON with object keys sorted at every level: equal values give equal strings. Every key is kept
 * as data, `__proto__`, `constructor` and `prototype` included.
 */
export function canonical(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

/** sha256 hex of a string (UTF-8) or bytes. */
export function sha256(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === 'object') {
    // A prototype-less object: assigning `__proto__` makes an own key instead of a prototype.
    const out: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
    for (const k of Object.keys(value as object).sort()) out[k] = sortKeys((value as Record<string, unknown>)[k]);
    return out;
  }
  return value;
}

/**
 * How deeply a JSON value we store may nest: `input_data` deeper than this is a 400, a result.json
 * deeper than this a `json_error`. Python's json module (what programs read and write JSON with)
 * gives up near 1,000 levels, and every layer that copies or serializes a value recurses: 512 is far
 * beyond real data and safely inside every parser on the way.
 */
export const MAX_JSON_DEPTH = 512;

/**
 * How deeply a parsed JSON value nests (a scalar is 0, `[]` and `{}` are 1), counted without
 * recursion so any depth a request body can hold is measured safely. Stops counting past `cap`.
 */
export function jsonDepth(value: unknown, cap = Infinity): number {
  let max = 0;
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== 'object') continue;
    const depth = d + 1;
    if (depth > max) max = depth;
    if (max > cap) return max;
    for (const child of Array.isArray(v) ? v : Object.values(v as object)) {
      if (child !== null && typeof child === 'object') stack.push([child, depth]);
    }
  }
  return max;
}
