import { describe, expect, it } from 'vitest';
import { LONG_STRING, jsonParts, jsonBytesNonceForTests as NONCE } from '../../../src/kube/json-bytes.ts';

const runner = 'QUJD'.repeat(17_000); // a 68 KB base64 string, as the runner in every Secret
const other = 'é"\\\n\u2028'.repeat(LONG_STRING); // long, with characters JSON escapes and multi-byte ones
const secret = (code: string) => ({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'x', labels: { a: 'b' } }, data: { runner, code } });

describe('jsonParts: the bytes of JSON.stringify in parts, long strings kept serialized', () => {
  const cases: [string, unknown][] = [
    ['no long string', { a: 1, b: ['x', null, true], c: { d: 'short' } }],
    ['a Secret with the runner', secret('cHJpbnQoMSk=')],
    ['the same Secret again (the runner from the kept copy)', secret('cHJpbnQoMik=')],
    ['the runner twice in one body', { a: runner, b: [runner, 'z'], c: runner }],
    ['a long string with escapes and multi-byte characters', { x: other, y: runner }],
    ['a long string just under the threshold', { x: 'a'.repeat(LONG_STRING - 1) }],
    ['a top-level long string', runner],
    ['a short string carrying the marker before a long one', { a: `${NONCE}:0`, b: runner }],
    ['a long string carrying the marker', { a: `${NONCE}:0${runner}`, b: runner }],
    ['a key carrying the marker', { [`${NONCE}:0`]: runner }],
    ['values with toJSON (a Date) and undefined', { at: new Date(0), gone: undefined, r: runner }],
    ['more long strings than are kept', { a: 'a'.repeat(LONG_STRING), b: 'b'.repeat(LONG_STRING), c: 'c'.repeat(LONG_STRING), d: 'd'.repeat(LONG_STRING), e: 'e'.repeat(LONG_STRING), f: runner }],
  ];
  it.each(cases)('%s', (_name, body) => {
    const got = Buffer.concat(jsonParts(body));
    expect(got.equals(Buffer.from(JSON.stringify(body)))).toBe(true);
    // And again: the second time the long strings come from what was kept.
    expect(Buffer.concat(jsonParts(body)).equals(got)).toBe(true);
  });
});
