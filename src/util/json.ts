/** Canonical JSON and hashing, shared by job type digests, idempotency and input hashes. */
import { createHash } from 'node:crypto';

/** JSON with object keys sorted at every level: equal values give equal strings. */
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
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(value as object).sort()) out[k] = sortKeys((value as Record<string, unknown>)[k]);
    return out;
  }
  return value;
}
