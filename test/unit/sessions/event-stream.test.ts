/** The resume point of a session's event stream (`Last-Event-ID`, docs/api.md): `{cell}:{n}`, `{cell}:end`, 400 otherwise. */
import { describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.ts';
import { parseSessionResume } from '../../../src/sessions/event-stream.ts';

describe('parseSessionResume', () => {
  it('absent or blank: from the first cell', () => {
    expect(parseSessionResume(undefined)).toEqual({ cell: 1, id: -1 });
    expect(parseSessionResume('  ')).toEqual({ cell: 1, id: -1 });
  });
  it('{cell}:{n} resumes inside that cell; {cell}:end after the session', () => {
    expect(parseSessionResume('3:17')).toEqual({ cell: 3, id: 17 });
    expect(parseSessionResume(' 2:0 ')).toEqual({ cell: 2, id: 0 });
    expect(parseSessionResume('0:999999999999999')).toEqual({ cell: 0, id: 999999999999999 });
    expect(parseSessionResume('4:end')).toEqual({ end: true });
  });
  it.each(['12', '1:', ':1', '1:-1', 'a:b', '1:2:3', '1:1234567890123456', '1234567890:1', '1:END', '1.5'])('refuses %j with a 400 naming the format', (raw) => {
    let err: unknown;
    try {
      parseSessionResume(raw);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe('validation_error');
    expect((err as AppError).message).toContain("'{cell}:{id}'");
  });
});
