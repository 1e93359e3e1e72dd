import { describe, expect, it } from 'vitest';
import { canonical, jsonDepth } from '../../../src/util/json.ts';

describe('canonical', () => {
  it('sorts keys at every level', () => {
    expect(canonical({ b: 1, a: { d: [{ z: 1, y: 2 }], c: null } })).toBe('{"a":{"c":null,"d":[{"y":2,"z":1}]},"b":1}');
  });

  it('keeps __proto__, constructor and prototype as ordinary keys', () => {
    const input = JSON.parse('{"__proto__":{"x":1},"constructor":{"prototype":{"y":2}},"a":1}') as unknown;
    expect(canonical(input)).toBe('{"__proto__":{"x":1},"a":1,"constructor":{"prototype":{"y":2}}}');
    expect(JSON.parse(canonical(input))).toEqual(input);
  });

  it('keeps NUL and lone surrogates as JSON escapes', () => {
    expect(canonical({ s: '\u0000\ud800' })).toBe('{"s":"\\u0000\\ud800"}');
  });
});

describe('jsonDepth', () => {
  it.each([
    [1, 0],
    [null, 0],
    ['x', 0],
    [[], 1],
    [{}, 1],
    [{ a: [1, { b: {} }] }, 4],
    [[[], [[[]]]], 4],
  ])('%j nests %i deep', (value, depth) => {
    expect(jsonDepth(value)).toBe(depth);
  });

  it('measures depths that would overflow a recursive walk', () => {
    const deep = JSON.parse(`${'['.repeat(100_000)}${']'.repeat(100_000)}`) as unknown;
    expect(jsonDepth(deep)).toBe(100_000);
    expect(jsonDepth(deep, 10)).toBe(11);
  });
});
