/**
 * Safe local defaults and logs for people (issue #12 points 5 and 6): the service listens on loopback
 * unless told otherwise, the `process` engine (no isolation) refuses any other address, and logs are
 * JSON for machines or readable (pino-pretty) for people.
 */
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.ts';
import { createLogger, isPretty } from '../../../src/logger.ts';
import { isLoopbackHost, unisolatedExposure } from '../../../src/main.ts';

describe('listen address', () => {
  it('is loopback by default; the file and SVC_HOST change it, SVC_HOST winning', () => {
    expect(parseConfig({}, {}).host).toBe('127.0.0.1');
    expect(parseConfig({ host: '0.0.0.0' }, {}).host).toBe('0.0.0.0');
    expect(parseConfig({ host: '10.0.0.5' }, { SVC_HOST: '::' }).host).toBe('::');
    expect(() => parseConfig({ host: '' }, {})).toThrow(/host/);
  });

  it.each([
    ['127.0.0.1', true],
    ['127.3.2.1', true],
    ['localhost', true],
    ['LOCALHOST', true],
    ['::1', true],
    ['[::1]', true],
    ['::ffff:127.0.0.1', true],
    ['0.0.0.0', false],
    ['::', false],
    ['10.1.2.3', false],
    ['128.0.0.1', false],
    ['localhost.example.org', false],
    ['1270.0.0.1', false],
  ])('%s is loopback: %s', (host, loopback) => {
    expect(isLoopbackHost(host)).toBe(loopback);
  });

  it('the process engine refuses a non-loopback address, naming it and the way out; isolated engines do not', () => {
    expect(unisolatedExposure('process', '0.0.0.0')).toMatch(/no isolation.*host is 0\.0\.0\.0.*127\.0\.0\.1/);
    expect(unisolatedExposure('process', '127.0.0.1')).toBeNull();
    expect(unisolatedExposure('bubblewrap', '0.0.0.0')).toBeNull();
    expect(unisolatedExposure('gvisor', '0.0.0.0')).toBeNull();
    expect(unisolatedExposure('kubernetes', '0.0.0.0')).toBeNull();
  });
});

describe('log format', () => {
  it('is chosen by config and SVC_LOG_FORMAT, auto by default', () => {
    expect(parseConfig({}, {}).log_format).toBe('auto');
    expect(parseConfig({ log_format: 'json' }, { SVC_LOG_FORMAT: 'pretty' }).log_format).toBe('pretty');
    expect(() => parseConfig({ log_format: 'xml' }, {})).toThrow(/log_format/);
  });

  it.each([
    ['auto', true, true],
    ['auto', false, false],
    ['json', true, false],
    ['pretty', false, true],
  ] as const)('%s with a terminal=%s is pretty: %s', (format, tty, pretty) => {
    expect(isPretty(format, tty)).toBe(pretty);
  });

  const capture = (format: 'json' | 'pretty') => {
    const out = new PassThrough();
    let text = '';
    out.on('data', (d: Buffer) => (text += d.toString()));
    const log = createLogger('info', format, out);
    log.child({ execution_id: 'e-1' }).info({ status: 'succeeded' }, 'run finished');
    log.debug('not at info');
    return () => text;
  };

  it('json: one object per line with level, message and fields', async () => {
    const text = capture('json');
    await new Promise((r) => setImmediate(r));
    const lines = text().trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: 'info', msg: 'run finished', execution_id: 'e-1', status: 'succeeded', service: 'sandpod' });
  });

  it('pretty: a readable line with the level, the message and the fields, not JSON', async () => {
    const text = capture('pretty');
    await new Promise((r) => setImmediate(r));
    const out = text();
    expect(out).toMatch(/INFO.*run finished/);
    expect(out).toContain('execution_id: "e-1"');
    expect(out).not.toContain('not at info');
    expect(() => JSON.parse(out.trim().split('\n')[0]!)).toThrow();
  });
});
