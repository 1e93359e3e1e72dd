/**
 * Bearer-token authentication (issue #13 point 2) on the real app and database: off without tokens;
 * with tokens every route but the probes answers 401 with the error body and the SPEC §4.14
 * headers; a good token passes; the tokens file is re-read when it changes (a rotated Secret).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../../src/config.ts';
import { silentLogger } from '../../../src/logger.ts';
import { TokenSet, parseTokens } from '../../../src/api/middleware/auth.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const TOKEN = 'tok-0123456789abcdef';
const OTHER = 'tok-fedcba9876543210';
const dir = mkdtempSync(path.join(tmpdir(), 'sandpod-auth-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('without tokens (the local default)', () => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService({ sandbox_engine: 'process' });
  }, 120_000);
  afterAll(() => svc?.close());

  it('answers every route without a token', async () => {
    expect((await svc.get('/executions')).status).toBe(200);
    expect((await svc.get('/job-types')).status).toBe(200);
  });
});

describe('with tokens', () => {
  let svc: TestService;
  let now = 0;
  const file = path.join(dir, 'tokens');
  beforeAll(async () => {
    writeFileSync(file, `# rotated by the chart\n${OTHER}\n\n`);
    svc = await startTestService({ sandbox_engine: 'process', auth: { tokens: [TOKEN], tokens_file: file } }, { now: () => now });
  }, 120_000);
  afterAll(() => svc?.close());

  it.each(['/livez', '/readyz', '/health'])('%s stays open', async (p) => {
    const res = await svc.get(p);
    expect(res.status).not.toBe(401);
  });

  it.each([
    ['GET', '/executions?limit=1'],
    ['GET', '/dlq'],
    ['GET', '/executions'],
    ['GET', '/job-types'],
    ['GET', '/metrics'],
    ['GET', '/openapi.json'],
    ['GET', '/pool/stats'],
    ['GET', '/no-such-route'],
    ['POST', '/execute'],
    ['POST', '/execute/async'],
  ])('%s %s without a token is 401 with the error body, the challenge and the §4.14 headers', async (method, p) => {
    const res = method === 'GET' ? await svc.get(p) : await svc.post(p, { code: 'print(1)' });
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toBe('Bearer realm="sandpod"');
    expect(res.headers.get('x-correlation-id')).toBeTruthy();
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    const body = (await res.json()) as Record<string, unknown>;
    expect(body).toMatchObject({ code: 'unauthorized', detail: expect.stringContaining('Authorization: Bearer') });
    expect(body.correlation_id).toBe(res.headers.get('x-correlation-id'));
  });

  it.each([
    ['a wrong token', `Bearer ${TOKEN}x`],
    ['a prefix of a token', `Bearer ${TOKEN.slice(0, -1)}`],
    ['another scheme', `Basic ${Buffer.from(`u:${TOKEN}`).toString('base64')}`],
    ['no token after Bearer', 'Bearer '],
    ['two tokens', `Bearer ${TOKEN} ${OTHER}`],
  ])('%s is 401 invalid_token', async (_what, header) => {
    const res = await svc.get('/executions', { authorization: header });
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toContain('error="invalid_token"');
  });

  it('a configured token and a token from the file both pass; nothing accepted without one is recorded', async () => {
    expect((await svc.get('/executions', { authorization: `Bearer ${TOKEN}` })).status).toBe(200);
    expect((await svc.get('/executions', { authorization: `bearer   ${OTHER}` })).status).toBe(200);
    const run = await svc.post('/execute', { code: 'print(6 * 7)' }, { authorization: `Bearer ${OTHER}` });
    expect(run.status).toBe(200);
    expect(((await run.json()) as { stdout: string }).stdout).toBe('42\n');
    const list = (await (await svc.get('/executions', { authorization: `Bearer ${TOKEN}` })).json()) as { items?: unknown[]; executions?: unknown[] };
    expect((list.items ?? list.executions ?? []).length).toBe(1);
  }, 60_000);

  it('a rotated file takes effect (the old file token stops working, the new one works), checked at most once a second', async () => {
    const NEW = 'tok-new-aaaaaaaaaaaaaaaa';
    writeFileSync(file, `${NEW}\n`);
    // Within the second since the last check the old set still holds.
    expect((await svc.get('/executions', { authorization: `Bearer ${OTHER}` })).status).toBe(200);
    now += 1500;
    expect((await svc.get('/executions', { authorization: `Bearer ${NEW}` })).status).toBe(200);
    expect((await svc.get('/executions', { authorization: `Bearer ${OTHER}` })).status).toBe(401);
    // The configured token is not in the file and keeps working.
    expect((await svc.get('/executions', { authorization: `Bearer ${TOKEN}` })).status).toBe(200);
  });

  const metric = async (name: string) => (await svc.metrics.registry.getSingleMetric(name)!.get()).values[0]?.value;
  const status = async (token: string) => (await svc.get('/executions', { authorization: `Bearer ${token}` })).status;

  it('a change of the file is authoritative and fails closed: emptied revokes its tokens, invalid or missing accepts no token at all', async () => {
    const NEW = 'tok-new-aaaaaaaaaaaaaaaa';
    const LATER = 'tok-later-bbbbbbbbbbbbbbbb';
    writeFileSync(file, `${NEW}\n`);
    now += 1500;
    expect(await status(NEW)).toBe(200);
    const errorsBefore = (await metric('sandpod_auth_tokens_file_errors_total')) ?? 0;
    // Emptied: every token it held is revoked; the configured one is not in it and still works.
    writeFileSync(file, '# all revoked\n');
    now += 1500;
    expect(await status(NEW)).toBe(401);
    expect(await status(TOKEN)).toBe(200);
    // A too-short token: nothing is valid, the configured token included, until the file is fixed.
    writeFileSync(file, `${NEW}\nabc\n`);
    now += 1500;
    expect(await status(NEW)).toBe(401);
    expect(await status(TOKEN)).toBe(401);
    expect(await metric('sandpod_auth_tokens_file_failed')).toBe(1);
    expect(await metric('sandpod_auth_tokens_file_errors_total')).toBe(errorsBefore + 1);
    // The probes still answer (a kubelet must not restart the pod over it).
    expect((await svc.get('/livez')).status).toBe(200);
    expect((await svc.get('/health')).status).not.toBe(401);
    // A missing file: still closed, counted again.
    rmSync(file);
    now += 1500;
    expect(await status(NEW)).toBe(401);
    expect(await status(TOKEN)).toBe(401);
    expect(await metric('sandpod_auth_tokens_file_errors_total')).toBe(errorsBefore + 2);
    // Fixed: open again for the listed tokens only.
    writeFileSync(file, `${LATER}\n`);
    now += 1500;
    expect(await status(LATER)).toBe(200);
    expect(await status(TOKEN)).toBe(200);
    expect(await status(NEW)).toBe(401);
    expect(await metric('sandpod_auth_tokens_file_failed')).toBe(0);
  });

  it('/health shows only its status without a valid token, and its details with one', async () => {
    const open = await svc.get('/health');
    expect(Object.keys((await open.json()) as object)).toEqual(['status']);
    const wrong = await svc.get('/health', { authorization: `Bearer ${TOKEN}x` });
    expect(Object.keys((await wrong.json()) as object)).toEqual(['status']);
    const full = (await (await svc.get('/health', { authorization: `Bearer ${TOKEN}` })).json()) as Record<string, unknown>;
    expect(full).toMatchObject({ status: expect.any(String), reasons: expect.any(Array), sandbox: expect.any(Object), database: expect.any(Object) });
  });
});

describe('a tokens file alone', () => {
  it('emptied, no token is valid any more: every request is 401 and the error is counted', async () => {
    const only = path.join(dir, 'only');
    const ONLY = 'tok-only-cccccccccccccccc';
    writeFileSync(only, `${ONLY}\n`);
    let t = 0;
    const svc = await startTestService({ sandbox_engine: 'process', auth: { tokens_file: only } }, { now: () => t });
    try {
      expect((await svc.get('/executions', { authorization: `Bearer ${ONLY}` })).status).toBe(200);
      writeFileSync(only, '');
      t += 1500;
      expect((await svc.get('/executions', { authorization: `Bearer ${ONLY}` })).status).toBe(401);
      expect((await svc.get('/job-types', { authorization: `Bearer ${ONLY}` })).status).toBe(401);
      expect((await svc.metrics.registry.getSingleMetric('sandpod_auth_tokens_file_errors_total')!.get()).values[0]?.value).toBe(1);
    } finally {
      await svc.close();
    }
  }, 120_000);
});

describe('tokens configuration', () => {
  it('reads tokens one per line, skipping blanks and comments', () => {
    expect(parseTokens('# c\n a-token \n\r\nb-token\r\n')).toEqual(['a-token', 'b-token']);
  });

  it('refuses short tokens and tokens with spaces in the config, and takes SVC_API_TOKENS', () => {
    expect(() => parseConfig({ auth: { tokens: ['short'] } }, {})).toThrow(/at least 16/);
    expect(() => parseConfig({ auth: { tokens: ['has a space in it, long'] } }, {})).toThrow(/spaces/);
    expect(parseConfig({}, { SVC_API_TOKENS: `${TOKEN}, ${OTHER}` }).auth.tokens).toEqual([TOKEN, OTHER]);
    expect(parseConfig({}, { SVC_API_TOKENS_FILE: '/etc/sandpod/tokens' }).auth.tokens_file).toBe('/etc/sandpod/tokens');
  });

  it('a tokens file that is missing, empty or holds a short token stops the start', () => {
    const clock = { now: () => 0 };
    expect(() => new TokenSet({ tokens: [], tokensFile: path.join(dir, 'missing') }, clock, silentLogger)).toThrow(ConfigError);
    writeFileSync(path.join(dir, 'empty'), '# nothing\n');
    expect(() => new TokenSet({ tokens: [], tokensFile: path.join(dir, 'empty') }, clock, silentLogger)).toThrow(/holds no token/);
    writeFileSync(path.join(dir, 'short'), 'abc\n');
    expect(() => new TokenSet({ tokens: [], tokensFile: path.join(dir, 'short') }, clock, silentLogger)).toThrow(/shorter than 16/);
  });
});

describe('the OpenAPI document', () => {
  it('declares the bearer scheme when tokens are configured, and none otherwise', async () => {
    const open = await startTestService({ sandbox_engine: 'process' });
    const closed = await startTestService({ sandbox_engine: 'process', auth: { tokens: [TOKEN] } });
    try {
      const a = (await (await open.get('/openapi.json')).json()) as Record<string, any>;
      expect(a.security).toEqual([]);
      expect(a.components?.securitySchemes?.bearerAuth).toBeUndefined();
      const b = (await (await closed.get('/openapi.json', { authorization: `Bearer ${TOKEN}` })).json()) as Record<string, any>;
      expect(b.security).toEqual([{ bearerAuth: [] }]);
      expect(b.components.securitySchemes.bearerAuth).toMatchObject({ type: 'http', scheme: 'bearer' });
    } finally {
      await open.close();
      await closed.close();
    }
  }, 120_000);
});
