/**
 * A write's JSON body as bytes, with the long strings that recur from write to write serialized
 * once. Every run's Secret carried the runner (about 67 KB of base64, one shared string) until it
 * moved to the runner sources ConfigMap: serializing it and encoding it to UTF-8 again for each
 * Secret was the largest single piece of a run's CPU in the replica at 1,000 in flight (issue 20,
 * bench/inflight.ts), and 180 KB of garbage per run. Kept for what still recurs (a session's or a
 * build's long texts, the same program sent again and again by a client); it costs one map. The
 * body comes as parts, written one after the other: joining them would copy the kept 67 KB into a
 * fresh buffer per write, memory outside the heap that drives collections by its own count. The
 * parts' bytes are exactly `Buffer.from(JSON.stringify(body))`; only how they are made differs.
 */
import { randomBytes } from 'node:crypto';

/** Strings at least this long are worth keeping serialized. */
export const LONG_STRING = 16 * 1024;
/** Serialized long strings kept, most recently used last (the runner, plus room for a few others). */
const KEEP = 4;
const kept = new Map<string, Buffer>();
/** A marker no body carries by chance: random per process, checked to occur only where put. */
const NONCE = randomBytes(12).toString('hex');

function serialized(s: string): Buffer {
  let b = kept.get(s);
  if (b) kept.delete(s);
  else b = Buffer.from(JSON.stringify(s));
  kept.set(s, b);
  if (kept.size > KEEP) kept.delete(kept.keys().next().value!);
  return b;
}

/** `Buffer.from(JSON.stringify(body))` in parts, the kept ones for its long strings. */
export function jsonParts(body: unknown): Buffer[] {
  const longs: string[] = [];
  const text = JSON.stringify(body, (_key, value: unknown) => {
    if (typeof value !== 'string' || value.length < LONG_STRING) return value;
    longs.push(value);
    return `${NONCE}:${longs.length - 1}`;
  });
  if (longs.length === 0) return [Buffer.from(text)];
  // Each mark exactly once, and nothing else carrying the nonce; else the plain way.
  if (text.split(NONCE).length - 1 !== longs.length) return [Buffer.from(JSON.stringify(body))];
  const parts: Buffer[] = [];
  let from = 0;
  for (let i = 0; i < longs.length; i++) {
    const mark = `"${NONCE}:${i}"`;
    const at = text.indexOf(mark, from);
    if (at < 0) return [Buffer.from(JSON.stringify(body))];
    parts.push(Buffer.from(text.slice(from, at)), serialized(longs[i]!));
    from = at + mark.length;
  }
  parts.push(Buffer.from(text.slice(from)));
  return parts;
}

/** The marker, for tests that try to confuse it. */
export const jsonBytesNonceForTests = NONCE;
