import { createHmac } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { authenticateProxyRequest, egressProxyUrl, signEgressToken, verifyEgressToken, type EgressGrant } from '../../../src/egress/token.ts';

const KEY = 'k'.repeat(32);
const OTHER_KEY = 'o'.repeat(32);
const NOW = Date.UTC(2026, 10, 24, 1, 0, 0);
const grant: EgressGrant = { executionId: '3f2b8c1e-6a0d-4e7b-9f35-0c1d2e3f4a5b', allowedHosts: ['api.github.com:443', '*.example.org'], expiresAtMs: NOW + 60_000 };
const basic = (user: string, pass: string) => `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;

describe('egress tokens', () => {
  it('round-trips a grant and is deterministic', () => {
    const t = signEgressToken(grant, KEY);
    expect(t).toBe(signEgressToken(grant, KEY));
    expect(t).toMatch(/^v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/);
    expect(verifyEgressToken(t, KEY, NOW)).toEqual({ grant });
  });

  it('expires at its expiry (to the second, rounded up)', () => {
    const t = signEgressToken({ ...grant, expiresAtMs: NOW + 1500 }, KEY);
    expect(verifyEgressToken(t, KEY, NOW + 1999)).toHaveProperty('grant.expiresAtMs', NOW + 2000);
    expect(verifyEgressToken(t, KEY, NOW + 2000)).toEqual({ refused: 'expired' });
  });

  const valid = signEgressToken(grant, KEY);
  const [, payload, mac] = valid.split('.') as [string, string, string];
  const forgedPayload = Buffer.from(JSON.stringify({ e: grant.executionId, h: ['*'], x: NOW / 1000 + 60 })).toString('base64url');
  const resigned = (body: string) => {
    const p = Buffer.from(body).toString('base64url');
    return `v1.${p}.${createHmac('sha256', KEY).update(`v1.${p}`).digest('base64url')}`;
  };
  it.each([
    ['another key', signEgressToken(grant, OTHER_KEY), 'bad signature'],
    ['widened patterns, old signature', `v1.${forgedPayload}.${mac}`, 'bad signature'],
    ['truncated signature', `v1.${payload}.${mac.slice(0, 20)}`, 'bad signature'],
    ['another version', `v2.${payload}.${mac}`, 'malformed'],
    ['two parts', `v1.${payload}`, 'malformed'],
    ['empty', '', 'malformed'],
    ['not JSON, signed', resigned('nope'), 'malformed'],
    ['no execution id, signed', resigned(JSON.stringify({ h: [], x: NOW / 1000 + 60 })), 'malformed'],
    ['patterns not strings, signed', resigned(JSON.stringify({ e: 'x', h: [1], x: NOW / 1000 + 60 })), 'malformed'],
    ['no expiry, signed', resigned(JSON.stringify({ e: 'x', h: [] })), 'malformed'],
  ])('refuses %s', (_name, token, why) => {
    expect(verifyEgressToken(token, KEY, NOW)).toEqual({ refused: why });
  });

  it('refuses to sign with a short key', () => {
    expect(() => signEgressToken(grant, 'short')).toThrow(/at least 32 bytes/);
  });

  it('puts the execution id and the token in the proxy URL, which Basic auth carries back', () => {
    const url = new URL(egressProxyUrl('http://egress.sandpod.svc:3128', grant, KEY));
    expect(`${url.protocol}//${url.host}`).toBe('http://egress.sandpod.svc:3128');
    expect(decodeURIComponent(url.username)).toBe(grant.executionId);
    expect(url.password).toBe(valid);
    expect(authenticateProxyRequest(basic(decodeURIComponent(url.username), url.password), KEY, NOW)).toEqual({ grant });
  });

  it.each([
    ['no header', undefined, 'missing'],
    ['not Basic', `Bearer ${valid}`, 'malformed'],
    ['no colon', `Basic ${Buffer.from(valid).toString('base64')}`, 'malformed'],
    ['another user', basic('someone-else', valid), 'user does not match'],
    ['forged', basic(grant.executionId, signEgressToken(grant, OTHER_KEY)), 'bad signature'],
  ])('authenticateProxyRequest refuses %s', (_name, header, why) => {
    expect(authenticateProxyRequest(header, KEY, NOW)).toEqual({ refused: why });
  });
});
