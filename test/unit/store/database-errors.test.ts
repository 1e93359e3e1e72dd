/** Which database errors mean "unreachable right now" (503 / keep the result), and URL redaction. */
import { describe, expect, it } from 'vitest';
import { DatabaseConnectError, isDatabaseUnavailable, redactUrl } from '../../../src/store/database.ts';

const withCode = (message: string, code: string) => Object.assign(new Error(message), { code });

describe('isDatabaseUnavailable', () => {
  it.each([
    ['refused', withCode('connect ECONNREFUSED 127.0.0.1:5432', 'ECONNREFUSED')],
    ['reset', withCode('read ECONNRESET', 'ECONNRESET')],
    ['admin shutdown (pg_terminate_backend, fast stop)', withCode('terminating connection due to administrator command', '57P01')],
    ['starting up', withCode('the database system is starting up', '57P03')],
    ['connection exception class', withCode('connection failure', '08006')],
    ['pg: ended connection', new Error('Connection terminated unexpectedly')],
    ['pg: dead client reused', new Error('Client has encountered a connection error and is not queryable')],
    ['both addresses of localhost refused', new AggregateError([withCode('connect ECONNREFUSED ::1:5432', 'ECONNREFUSED')], '')],
    ['wrapped', new Error('migration failed', { cause: withCode('x', 'ECONNREFUSED') })],
  ])('%s → true', (_name, err) => {
    expect(isDatabaseUnavailable(err)).toBe(true);
  });

  it.each([
    ['a unique violation', withCode('duplicate key value violates unique constraint', '23505')],
    ['a syntax error', withCode('syntax error at or near "x"', '42601')],
    ['untranslatable character', withCode('unsupported Unicode escape sequence', '22P05')],
    ['query canceled (57014 is not a shutdown)', withCode('canceling statement due to statement timeout', '57014')],
    ['a plain bug', new TypeError('x is undefined')],
    ['not an error', 'ECONNREFUSED'],
  ])('%s → false', (_name, err) => {
    expect(isDatabaseUnavailable(err)).toBe(false);
  });
});

describe('redactUrl and DatabaseConnectError', () => {
  it('hides the password only', () => {
    expect(redactUrl('postgres://svc:hunter2@db.example:5433/sandpod?sslmode=require')).toBe('postgres://svc:***@db.example:5433/sandpod?sslmode=require');
    expect(redactUrl('postgres://svc@db:5432/x')).toBe('postgres://svc@db:5432/x');
    expect(redactUrl('not a url')).not.toContain('not a url');
  });

  it('names the URL without the password, and the cause', () => {
    const e = new DatabaseConnectError('postgres://u:pw@h:1/d', withCode('connect ECONNREFUSED 127.0.0.1:1', 'ECONNREFUSED'));
    expect(e.message).toBe('cannot connect to the database at postgres://u:***@h:1/d: connect ECONNREFUSED 127.0.0.1:1');
    const agg = new DatabaseConnectError('postgres://h/d', new AggregateError([new Error('a'), new Error('b')], ''));
    expect(agg.message).toBe('cannot connect to the database at postgres://h/d: a; b');
  });
});
