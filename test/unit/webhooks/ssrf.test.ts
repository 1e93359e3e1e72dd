import { describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.ts';
import { checkCallbackUrl, parseCallbackUrl, resolveTarget, type Lookup } from '../../../src/webhooks/ssrf.ts';

const rules = { allowed_hosts: ['hooks.example.com', '*.receivers.example.org:8443', '203.0.113.9', '127.0.0.1:9999'], allow_private_addresses: false };
const lookupOf = (table: Record<string, string[]>): Lookup => async (host) => {
  const a = table[host];
  if (!a) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
  return a.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
};

describe('parseCallbackUrl (submission)', () => {
  it.each([
    ['https://hooks.example.com/done', true],
    ['http://hooks.example.com:8080/done?token=x', true],
    ['https://HOOKS.example.com./done', true],
    ['https://a.receivers.example.org:8443/x', true],
    ['https://a.receivers.example.org/x', 'does not match webhooks.allowed_hosts'],
    ['https://receivers.example.org:8443/x', 'does not match'],
    ['http://203.0.113.9/x', true],
    ['http://127.0.0.1:9999/x', true],
    // Loopback, link-local and private literals: only an IP pattern naming them matches.
    ['http://127.0.0.1:8000/x', 'does not match'],
    ['http://169.254.169.254/latest/meta-data', 'does not match'],
    ['http://[::1]:9999/x', 'does not match'],
    ['http://0x7f.1:9999/x', true], // WHATWG URL reads it as 127.0.0.1, the address that is named and dialled
    ['http://localhost:9999/x', 'does not match'],
    ['ftp://hooks.example.com/x', 'must use http or https, not ftp'],
    ['file:///etc/passwd', 'must use http or https'],
    ['hooks.example.com/x', 'must be an absolute http:// or https:// URL'],
    ['https://user:pw@hooks.example.com/x', 'must not carry credentials'],
    [`https://hooks.example.com/${'a'.repeat(2100)}`, 'at most 2048 characters'],
  ])('%s', (url, want) => {
    const r = parseCallbackUrl(url, rules);
    if (want === true) expect(r).not.toHaveProperty('problem');
    else expect((r as { problem: string }).problem).toContain(want);
  });

  it('is a 400 naming the field and the list', () => {
    expect(() => checkCallbackUrl('https://evil.example.net/x', rules)).toThrow(AppError);
    try {
      checkCallbackUrl('https://evil.example.net/x', rules);
    } catch (err) {
      expect((err as AppError).code).toBe('validation_error');
      expect((err as AppError).message).toBe(
        'callback_url: host evil.example.net does not match webhooks.allowed_hosts (hooks.example.com, *.receivers.example.org:8443, 203.0.113.9, 127.0.0.1:9999)',
      );
    }
    expect(parseCallbackUrl('https://x.example.com/', { allowed_hosts: [] })).toEqual({ problem: 'callbacks are not enabled on this service (webhooks.allowed_hosts is empty)' });
  });
});

describe('resolveTarget (send time)', () => {
  const names = { allowed_hosts: ['*.example.com', '*'], allow_private_addresses: false };
  it.each([
    ['public', 'https://ok.example.com/x', { 'ok.example.com': ['93.184.216.34'] }, { address: '93.184.216.34', family: 4 }],
    ['loopback', 'https://lo.example.com/x', { 'lo.example.com': ['127.0.0.1'] }, 'resolves to 127.0.0.1'],
    ['link-local (metadata)', 'https://md.example.com/x', { 'md.example.com': ['169.254.169.254'] }, 'resolves to 169.254.169.254'],
    ['private', 'https://in.example.com/x', { 'in.example.com': ['10.96.0.10'] }, 'resolves to 10.96.0.10'],
    ['CGNAT (cluster ranges)', 'https://cg.example.com/x', { 'cg.example.com': ['100.64.1.2'] }, 'resolves to 100.64.1.2'],
    ['IPv6 loopback', 'https://v6.example.com/x', { 'v6.example.com': ['::1'] }, 'resolves to ::1'],
    ['IPv4-mapped loopback', 'https://m.example.com/x', { 'm.example.com': ['::ffff:127.0.0.1'] }, 'resolves to ::ffff:127.0.0.1'],
    ['one bad address among good ones', 'https://mix.example.com/x', { 'mix.example.com': ['93.184.216.34', '127.0.0.1'] }, 'resolves to 127.0.0.1'],
  ])('%s', async (_name, url, table, want) => {
    const r = await resolveTarget(url, names, lookupOf(table));
    if (typeof want === 'string') expect((r as { refused: string }).refused).toContain(want);
    else expect(r).toMatchObject(want);
  });

  it('the real resolver: localhost resolves to loopback and is refused', async () => {
    const r = await resolveTarget('http://localhost:9/x', { allowed_hosts: ['localhost'], allow_private_addresses: false });
    expect((r as { refused: string }).refused).toMatch(/^localhost resolves to (127\.0\.0\.1|::1), a loopback/);
  });

  it('allow_private_addresses lets a name lead to a private address', async () => {
    const r = await resolveTarget('https://in.example.com/x', { ...names, allow_private_addresses: true }, lookupOf({ 'in.example.com': ['10.96.0.10'] }));
    expect(r).toMatchObject({ address: '10.96.0.10' });
  });

  it('an address named in allowed_hosts is dialled as is, without a lookup', async () => {
    const r = await resolveTarget('http://127.0.0.1:9999/x', rules, () => Promise.reject(new Error('no lookup expected')));
    expect(r).toMatchObject({ address: '127.0.0.1', family: 4 });
  });

  it('a URL the list no longer allows is refused; a resolver failure is an error (retried), not a refusal', async () => {
    expect(await resolveTarget('https://hooks.example.com/x', { allowed_hosts: ['other.example.com'], allow_private_addresses: false })).toMatchObject({ refused: expect.stringContaining('does not match') });
    await expect(resolveTarget('https://gone.example.com/x', names, lookupOf({}))).rejects.toThrow('cannot resolve gone.example.com: ENOTFOUND');
  });
});
