/**
 * The request-context middleware on a small hono app: which `X-Correlation-ID` values are kept (SPEC
 * §4.14), what replaces the others, the security headers on every response (immutable ones included),
 * and the access log line carrying the id.
 */
import { Writable } from 'node:stream';
import { Hono } from 'hono';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import type { AppEnv } from '../../../src/api/deps.ts';
import { requestContext, securityHeaders } from '../../../src/api/middleware/request-context.ts';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** An app whose handler answers with the id the middleware set; log lines land in `lines`. */
function appWithLog(): { app: Hono<AppEnv>; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString('utf8').split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  const root = pino({ level: 'debug' }, sink);
  const app = new Hono<AppEnv>();
  app.use('*', requestContext(root));
  app.get('/id', (c) => {
    c.get('logger').info('inside');
    return c.json({ id: c.get('correlationId') });
  });
  app.get('/missing', (c) => c.json({ nope: true }, 404));
  // Response.redirect() has immutable headers: the middleware must still add its own.
  app.get('/redirect', () => Response.redirect('http://example.test/elsewhere', 302));
  return { app, lines };
}

async function idFor(header: string | undefined): Promise<{ body: string; header: string | null }> {
  const { app } = appWithLog();
  const res = await app.request('/id', header === undefined ? {} : { headers: { 'X-Correlation-ID': header } });
  const body = ((await res.json()) as { id: string }).id;
  return { body, header: res.headers.get('X-Correlation-ID') };
}

describe('requestContext: X-Correlation-ID', () => {
  it.each([
    ['letters and digits', 'abc123XYZ'],
    ['every allowed punctuation', 'a.b_c:d-e'],
    ['one character', 'x'],
    ['exactly 128 characters', 'k'.repeat(128)],
  ])('keeps a valid id (%s) and echoes it', async (_label, given) => {
    const r = await idFor(given);
    expect(r.body).toBe(given);
    expect(r.header).toBe(given);
  });

  it.each([
    ['129 characters', 'k'.repeat(129)],
    ['a space inside', 'a b'],
    ['a slash', 'a/b'],
    ['a quote', 'a"b'],
    ['a valid id followed by junk', 'abc;rm'],
    ['junk followed by a valid id', '<x>abc'],
    ['a non-ASCII letter', 'caf\u00e9'],
    ['an empty value', ''],
  ])('replaces an unusable id (%s) with a fresh UUID', async (_label, given) => {
    const r = await idFor(given);
    expect(r.body).toMatch(UUID);
    expect(r.header).toBe(r.body);
  });

  it('generates a UUID when the header is absent, a new one per request', async () => {
    const a = await idFor(undefined);
    const b = await idFor(undefined);
    expect(a.body).toMatch(UUID);
    expect(a.header).toBe(a.body);
    expect(b.body).not.toBe(a.body);
  });
});

describe('requestContext: headers and log', () => {
  it('sets the §4.14 headers on every response, an error status included', async () => {
    const { app } = appWithLog();
    for (const path of ['/id', '/missing']) {
      const res = await app.request(path, { headers: { 'X-Correlation-ID': 'corr-1' } });
      expect(res.headers.get('X-Correlation-ID')).toBe('corr-1');
      expect(res.headers.get('X-Content-Type-Options')).toBe('nosniff');
      expect(res.headers.get('X-Frame-Options')).toBe('DENY');
    }
  });

  it('adds the headers to a response whose headers are immutable', async () => {
    const { app } = appWithLog();
    const res = await app.request('/redirect', { headers: { 'X-Correlation-ID': 'corr-2' } });
    expect(res.status).toBe(302);
    expect(res.headers.get('Location')).toBe('http://example.test/elsewhere');
    expect(res.headers.get('X-Correlation-ID')).toBe('corr-2');
    expect(res.headers.get('X-Content-Type-Options')).toBe('nosniff');
    expect(res.headers.get('X-Frame-Options')).toBe('DENY');
  });

  it('gives the handler a logger carrying the id and logs one access line after the response', async () => {
    const { app, lines } = appWithLog();
    const t0 = performance.now();
    await app.request('/missing', { headers: { 'X-Correlation-ID': 'corr-3' } });
    const took = performance.now() - t0;
    await app.request('/id', { headers: { 'X-Correlation-ID': 'corr-4' } });
    const inside = lines.find((l) => l.msg === 'inside');
    expect(inside).toMatchObject({ correlation_id: 'corr-4' });
    const access = lines.filter((l) => l.msg === 'request');
    expect(access).toHaveLength(2);
    expect(access[0]).toMatchObject({ correlation_id: 'corr-3', method: 'GET', path: '/missing', status: 404, level: 20 });
    expect(access[1]).toMatchObject({ correlation_id: 'corr-4', method: 'GET', path: '/id', status: 200 });
    expect(typeof access[0]!.ms).toBe('number');
    expect(access[0]!.ms).toBeGreaterThanOrEqual(0);
    expect(access[0]!.ms).toBeLessThanOrEqual(Math.ceil(took));
    expect(Number.isInteger(access[0]!.ms)).toBe(true);
  });

  it('securityHeaders lists exactly the three headers', () => {
    expect(securityHeaders('z')).toEqual([
      ['X-Correlation-ID', 'z'],
      ['X-Content-Type-Options', 'nosniff'],
      ['X-Frame-Options', 'DENY'],
    ]);
  });
});
