import { describe, expect, it } from 'vitest';
import { canonical, isExactNumber, jsonDepth, JsonDepthError, MAX_DOCUMENT_DEPTH, parseJson, stringifyJson, toPlain } from '../../../src/util/json.ts';

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

describe('exact numbers', () => {
  // Each text survives parseJson → stringifyJson unchanged; `plain` says whether it stays a JS number.
  it.each([
    ['42', true],
    ['-3.25', true],
    ['5e-324', true],
    ['12345678901234567890', false],
    ['-9007199254740993', false],
    ['0.1000000000000000055511151231257827', false],
    ['3.141592653589793238462643383279', false],
    ['1.0', false],
    ['1e2', false],
    ['1E+2', false],
    ['-0', false],
    ['1e400', false],
    ['-1e-400', false],
    ['123456789012345678901234567890e-10', false],
  ])('%s round-trips (plain number: %s)', (text, plain) => {
    const doc = `{"n":${text},"a":[${text}],"d":{"x":${text}}}`;
    const value = parseJson(doc) as { n: unknown };
    expect(typeof value.n === 'number').toBe(plain);
    expect(isExactNumber(value.n)).toBe(!plain);
    expect(stringifyJson(value)).toBe(doc);
    expect(stringifyJson(parseJson(text))).toBe(text);
  });

  it('canonical keeps number texts: equal texts hash equal, other spellings do not', () => {
    const a = canonical(parseJson('{ "b": 12345678901234567890, "a": 1.0 }'));
    expect(a).toBe('{"a":1.0,"b":12345678901234567890}');
    expect(canonical(parseJson('{"a":1.0,"b":12345678901234567890}'))).toBe(a);
    expect(canonical(parseJson('{"a":1,"b":12345678901234567890}'))).not.toBe(a);
    expect(canonical(parseJson('{"a":1.0,"b":12345678901234567891}'))).not.toBe(a);
  });

  it('reads what JSON.parse reads otherwise: duplicate keys (last wins), __proto__, strings, errors', () => {
    for (const text of ['{"a":1,"a":2}', '{"a":{"x":1},"a":[2]}', '{"__proto__":{"x":1.5}}', '{"s":"\\u0000\\ud800","t":"\\u00e9"}', '[]', '"x"', 'null', ' true ']) {
      expect(parseJson(text), text).toEqual(JSON.parse(text));
      expect(stringifyJson(parseJson(text)), text).toBe(JSON.stringify(JSON.parse(text)));
    }
    expect(Object.keys(parseJson('{"__proto__":{"x":12345678901234567890}}') as object)).toEqual(['__proto__']);
    for (const bad of ['{"a":1,}', '{"a":01}', '{"a":.5}', '{"a":NaN}', '[1] x', '']) expect(() => parseJson(bad), bad).toThrow(SyntaxError);
  });

  it('refuses documents deeper than MAX_DOCUMENT_DEPTH with the plain reading attached', () => {
    const nest = (d: number) => `${'['.repeat(d)}12345678901234567890${']'.repeat(d)}`;
    expect(stringifyJson(parseJson(nest(MAX_DOCUMENT_DEPTH)))).toBe(nest(MAX_DOCUMENT_DEPTH));
    for (const d of [MAX_DOCUMENT_DEPTH + 1, 100_000]) {
      let err: unknown;
      try {
        parseJson(nest(d));
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(JsonDepthError);
      expect(jsonDepth((err as JsonDepthError).value)).toBe(d);
    }
  });

  it('toPlain gives the doubles JSON.parse would have given, keys kept', () => {
    const text = '{"t":30.0,"n":[1e2,12345678901234567890],"__proto__":{"x":-0}}';
    const plain = toPlain(parseJson(text));
    expect(plain).toEqual(JSON.parse(text));
    expect(Object.keys(plain as object)).toContain('__proto__');
    expect(stringifyJson(plain)).toBe(JSON.stringify(JSON.parse(text)));
  });

  it('counts an exact number as a scalar', () => {
    expect(jsonDepth(parseJson('{"n":[12345678901234567890]}'))).toBe(2);
  });
});
