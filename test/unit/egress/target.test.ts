/**
 * The egress proxy's target parser (src/egress/target.ts) under hostile input, as tables and as
 * fast-check properties: NUL, `%00`, Unicode dots, IDN, IPv4 in decimal/octal/hex/short forms, IPv6
 * with a zone, embedded credentials, port overflow. Then through the real proxy on a socket with the
 * resolver and the dialler injected: for every allowed or refused request, what was checked is what
 * was looked up and what was dialled.
 */
import fc from 'fast-check';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EgressProxy, isPublicAddress, type EgressDecision } from '../../../src/egress/proxy.ts';
import { hostHeader, parseAbsoluteTarget, parseConnectTarget, parseHost, parsePort } from '../../../src/egress/target.ts';
import { hostMatches } from '../../../src/jobtypes/host-patterns.ts';

describe('parseHost: the forms taken', () => {
  it.each([
    ['example.com', 'name', 'example.com'],
    ['API.Example.COM.', 'name', 'api.example.com'],
    ['xn--bcher-kva.example', 'name', 'xn--bcher-kva.example'],
    ['localhost', 'name', 'localhost'],
    ['a1.b-2.c3', 'name', 'a1.b-2.c3'],
    ['44.1.2.3', 'ipv4', '44.1.2.3'],
    ['0.0.0.0', 'ipv4', '0.0.0.0'],
    ['255.255.255.255', 'ipv4', '255.255.255.255'],
    ['[2001:DB8::1]', 'ipv6', '2001:db8::1'],
    ['[::ffff:127.0.0.1]', 'ipv6', '::ffff:127.0.0.1'],
    [`${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(61)}`, 'name', `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(61)}`],
  ])('%j → %s %j', (raw, kind, host) => expect(parseHost(raw)).toEqual({ kind, host }));

  it.each([
    ['44.1.2.3\0.wild.test', 'a NUL'],
    ['44.1.2.3%00.wild.test', 'a percent escape'],
    ['a%2eb.test', 'a percent escape'],
    ['44.1.2.3\u3002wild.test', 'an ideographic full stop'],
    ['44.1.2.3\uff0ewild.test', 'a full-width full stop'],
    ['44.1.2.3\uff61wild.test', 'a half-width ideographic full stop'],
    ['bücher.example', 'a Unicode letter (IDN not in xn-- form)'],
    ['\u212aelvin.test', 'a Kelvin sign (lower-cases to k)'],
    ['2130706433', 'a decimal IPv4'],
    ['0x7f000001', 'a hexadecimal IPv4'],
    ['0177.0.0.1', 'an octal part'],
    ['0x7f.0.0.1', 'a hexadecimal part'],
    ['127.1', 'a short IPv4'],
    ['127.0.1', 'a short IPv4'],
    ['44.1.2.3.', 'an IPv4 with a trailing dot'],
    ['1.2.3.4.5', 'five numeric parts'],
    ['256.1.1.1', 'a part over 255'],
    ['01.2.3.4', 'a leading zero'],
    ['a.0x', 'a last label 0x'],
    ['[fe80::1%eth0]', 'an IPv6 zone'],
    ['[fe80::1%25eth0]', 'an encoded IPv6 zone'],
    ['::1', 'IPv6 without brackets'],
    ['[127.0.0.1]', 'IPv4 in brackets'],
    ['user@example.com', 'credentials'],
    ['user:pw@example.com', 'credentials with a password'],
    ['example.com..', 'two trailing dots'],
    ['.example.com', 'an empty first label'],
    ['-a.example.com', 'a label starting with a hyphen'],
    ['a-.example.com', 'a label ending with a hyphen'],
    ['a_b.example.com', 'an underscore'],
    ['a b.example.com', 'a space'],
    ['a\tb.example.com', 'a tab'],
    [`${'a'.repeat(64)}.com`, 'a label of 64'],
    [`${'a.'.repeat(126)}aa`, 'a name of 254'],
    ['', 'nothing'],
    ['.', 'a lone dot'],
  ])('%j (%s) is malformed', (raw) => expect(parseHost(raw)).toHaveProperty('malformed'));
});

describe('the reasons given (the 400 a program sees)', () => {
  it.each([
    ['.', 'empty name'],
    ['a..b', 'empty label'],
    [`${'a'.repeat(64)}.com`, 'label longer than 63 characters'],
    [`${'a.'.repeat(126)}aa`, 'name longer than 253 characters'],
    ['-a.test', 'only letters, digits and inner hyphens are allowed in a label'],
    ['a.1', 'not a canonical IPv4 address (four decimal parts, no leading zeros)'],
    ['a b.test', 'only ASCII letters, digits, hyphens and dots are allowed'],
    ['a\0.test', 'only ASCII letters, digits, hyphens and dots are allowed'],
    ['[fe80::1%eth0]', 'not an IPv6 address in brackets (zones are not allowed)'],
  ])('%j: %s', (raw, why) => expect(parseHost(raw)).toEqual({ malformed: `malformed host ${JSON.stringify(raw)}: ${why}` }));

  it.each([
    ['http://u@a.test/', 'credentials in a proxied URL are not supported'],
    ['http://a.test/x\x01y', 'control characters in the URL path'],
    ['http://a]b.test/', 'malformed host "a]b.test"'],
    ['/p?u=http://a.test/', 'a proxied request needs an absolute http:// URL (use CONNECT for https)'],
    ['ftp://a.test/', 'unsupported scheme ftp: (use CONNECT for https)'],
  ])('%j: %s', (target, why) => expect(parseAbsoluteTarget(target)).toEqual({ malformed: why }));

  it('a name whose last label only starts with a digit is a name', () => {
    expect(parseHost('a.1st')).toEqual({ kind: 'name', host: 'a.1st' });
    expect(parseHost('x.0xz')).toEqual({ kind: 'name', host: 'x.0xz' });
  });

  it('a fragment is dropped, also one right after the authority', () => {
    expect(parseAbsoluteTarget('http://a.test#f')).toEqual({ host: { kind: 'name', host: 'a.test' }, port: 80, path: '/' });
    expect(parseAbsoluteTarget('http://a.test/p#f')).toMatchObject({ path: '/p' });
  });

  it('the Host header sent upstream: brackets around IPv6, the port unless 80', () => {
    expect(hostHeader({ host: { kind: 'ipv6', host: '2001:db8::1' }, port: 80 })).toBe('[2001:db8::1]');
    expect(hostHeader({ host: { kind: 'ipv6', host: '2001:db8::1' }, port: 8080 })).toBe('[2001:db8::1]:8080');
    expect(hostHeader({ host: { kind: 'name', host: 'a.test' }, port: 80 })).toBe('a.test');
    expect(hostHeader({ host: { kind: 'ipv4', host: '203.0.113.7' }, port: 81 })).toBe('203.0.113.7:81');
  });
});

describe('parsePort and the targets', () => {
  it.each(['1', '80', '65535'])('port %s', (p) => expect(parsePort(p)).toBe(Number(p)));
  it.each(['0', '65536', '99999', '080', '+80', '-1', '0x50', '1e3', '', ' 80', '8 0', '4294967377'])('port %j is refused', (p) => expect(parsePort(p)).toHaveProperty('malformed'));

  it('CONNECT and absolute form share the host rules', () => {
    expect(parseConnectTarget('a.wild.test:443')).toEqual({ host: { kind: 'name', host: 'a.wild.test' }, port: 443 });
    expect(parseConnectTarget('[::1]:8080')).toEqual({ host: { kind: 'ipv6', host: '::1' }, port: 8080 });
    expect(parseAbsoluteTarget('http://A.wild.test/x?y#z')).toEqual({ host: { kind: 'name', host: 'a.wild.test' }, port: 80, path: '/x?y' });
    expect(parseAbsoluteTarget('HTTP://a.wild.test?q')).toEqual({ host: { kind: 'name', host: 'a.wild.test' }, port: 80, path: '/?q' });
    expect(parseAbsoluteTarget('http://[2001:db8::1]:81')).toEqual({ host: { kind: 'ipv6', host: '2001:db8::1' }, port: 81, path: '/' });
    for (const bad of ['http://u@a.wild.test/', 'http://u:p@a.wild.test/', 'http://a.wild.test:99999/', 'http://a.wild.test:/', 'http://0x7f.1/', 'http://a.wild.test/\x00', 'http://[fe80::1%25eth0]/']) {
      expect(parseAbsoluteTarget(bad), bad).toHaveProperty('malformed');
    }
    for (const bad of ['u@a.wild.test:443', 'a.wild.test:0443', 'a.wild.test:65536', '[fe80::1%eth0]:443', '2130706433:443', 'a.wild.test']) {
      expect(parseConnectTarget(bad), bad).toHaveProperty('malformed');
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

/** Pieces a hostile host is built from. */
const PIECES = [
  'a', 'Z', 'wild', 'test', 'xn--', '0', '1', '9', '255', '256', '0x', '0x7f', '017', '-', '.', '..', '\0', '%00', '%', '%2e', '\u3002', '\uff0e', '\uff61',
  'ü', '\u212a', '@', 'user@', ':', '[', ']', ' ', '\t', '/', '?', '#', '\\', '44.1.2.3', '.wild.test', '127.0.0.1', '::1', '%25eth0', 'fe80::1',
];
const hostileHost = fc.oneof(
  fc.array(fc.constantFrom(...PIECES), { maxLength: 10 }).map((p) => p.join('')),
  fc.string({ unit: 'binary', maxLength: 30 }),
  // IPv4 in every form inet_aton takes: whole decimal, octal and hex parts, one to four parts.
  fc.tuple(fc.integer({ min: 0, max: 0xffffffff }), fc.constantFrom('dec', 'oct', 'hex'), fc.integer({ min: 1, max: 4 })).map(([n, base, parts]) => {
    const bytes = [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255];
    const fmt = (x: number) => (base === 'dec' ? String(x) : base === 'oct' ? `0${x.toString(8)}` : `0x${x.toString(16)}`);
    if (parts === 1) return fmt(n);
    const head = bytes.slice(0, parts - 1);
    const tail = bytes.slice(parts - 1).reduce((a, b) => a * 256 + b, 0);
    return [...head, tail].map(fmt).join('.');
  }),
  fc.ipV6().map((a) => `[${a}%eth0]`),
  fc.tuple(fc.constantFrom('u', 'u:p', '44.1.2.3'), fc.domain()).map(([u, d]) => `${u}@${d}`),
  fc.domain(),
  // Hosts the patterns below name, so that allowed requests are drawn often.
  fc.constantFrom('44.1.2.3', '127.0.0.1', '[2001:db8::1]', '203.0.113.7', 'a.wild.test', 'WILD.test.', 'x.inner.test'),
  fc.ipV4(),
  fc.ipV6().map((a) => `[${a}]`),
);
const hostilePort = fc.oneof(fc.constantFrom('443', '80'), fc.integer({ min: 0, max: 70_000 }).map(String), fc.constantFrom('080', '+80', '65536', '99999', '4294967377', '0x50', '1e3', ''));

describe('parseHost properties', () => {
  it('whatever it takes is a plain LDH name or a canonical literal, and parsing it again gives it back', () => {
    fc.assert(
      fc.property(hostileHost, (raw) => {
        const p = parseHost(raw);
        if ('malformed' in p) return;
        if (p.kind === 'name') {
          expect(p.host).toMatch(/^[a-z0-9.-]+$/);
          expect(p.host.length).toBeLessThanOrEqual(253);
          expect(p.host.split('.').every((l) => l.length >= 1 && l.length <= 63 && !l.startsWith('-') && !l.endsWith('-'))).toBe(true);
          expect(p.host).not.toMatch(/(^|\.)(\d+|0x[0-9a-f]*)$/);
          expect(net.isIP(p.host)).toBe(0);
        } else if (p.kind === 'ipv4') {
          expect(p.host).toBe(raw);
          expect(net.isIPv4(p.host)).toBe(true);
          expect(p.host.split('.').map((x) => String(Number(x))).join('.')).toBe(p.host);
        } else {
          expect(raw).toBe(`[${raw.slice(1, -1)}]`);
          expect(net.isIPv6(p.host)).toBe(true);
          expect(p.host).not.toContain('%');
        }
        expect(parseHost(p.kind === 'ipv6' ? `[${p.host}]` : p.host)).toEqual(p);
      }),
      { numRuns: 3000 },
    );
  });

  it('an IPv4 address in any form but the canonical one is malformed, never a name', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 0xffffffff }), fc.constantFrom('dec', 'oct', 'hex'), fc.integer({ min: 1, max: 4 }), (n, base, parts) => {
        const bytes = [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255];
        const fmt = (x: number) => (base === 'dec' ? String(x) : base === 'oct' ? `0${x.toString(8)}` : `0x${x.toString(16)}`);
        const tail = bytes.slice(parts - 1).reduce((a, b) => a * 256 + b, 0);
        const raw = [...bytes.slice(0, parts - 1), tail].map(fmt).join('.');
        const p = parseHost(raw);
        if (base === 'dec' && parts === 4) expect(p).toEqual({ kind: 'ipv4', host: bytes.join('.') });
        else expect(p).toHaveProperty('malformed');
      }),
      { numRuns: 2000 },
    );
  });

  it('a port is taken only as 1–65535 in plain decimal', () => {
    fc.assert(
      fc.property(hostilePort, (raw) => {
        const p = parsePort(raw);
        if (typeof p === 'number') {
          expect(String(p)).toBe(raw);
          expect(p >= 1 && p <= 65535).toBe(true);
        } else expect(/^[1-9]\d*$/.test(raw) && Number(raw) <= 65535).toBe(false);
      }),
      { numRuns: 2000 },
    );
  });
});

// ---------------------------------------------------------------------------------------------
// Checked is dialled: the real proxy on a Unix socket, resolver and dialler recorded
// ---------------------------------------------------------------------------------------------

/**
 * A resolver shaped like getaddrinfo where it hurt: it reads up to a NUL and takes inet_aton's
 * number forms as addresses. Other names get a public address derived from the name, except names
 * with `inner` in them (a private one).
 */
function hostileResolve(name: string): string {
  const cut = name.split('\0')[0]!;
  if (net.isIPv4(cut)) return cut;
  if (cut.includes('inner')) return '10.0.0.7';
  let h = 0;
  for (const ch of cut) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return `8.${(h >>> 16) & 255}.${(h >>> 8) & 255}.${h & 255}`;
}

const PATTERN_POOL = ['*.wild.test', 'wild.test', '*', '44.1.2.3', '203.0.113.7:443', '[2001:db8::1]', '*.inner.test', '127.0.0.1'];

let dir: string;
let echo: net.Server;
let echoPort: number;
beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'sp-egress-prop-'));
  echo = net.createServer((s) => {
    s.on('error', () => {});
    s.pipe(s);
  });
  await new Promise<void>((r) => echo.listen(0, '127.0.0.1', () => r()));
  echoPort = (echo.address() as net.AddressInfo).port;
});
afterAll(() => {
  echo.close();
  rmSync(dir, { recursive: true, force: true });
});

function exchange(sock: string, request: string): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect(sock, () => s.write(request, 'utf8'));
    let got = '';
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1');
      // A tunnel stays open: its status line is the answer.
      if (got.includes('\r\n')) s.end();
    });
    s.on('error', () => {});
    s.on('close', () => resolve(got));
  });
}

describe('what was checked is what was dialled', () => {
  it('for every request, CONNECT or absolute-form, allowed or refused', async () => {
    let n = 0;
    const seenOutcomes = new Set<string>();
    await fc.assert(
      fc.asyncProperty(
        hostileHost.filter((h) => !/[\r\n]/.test(h)),
        hostilePort,
        fc.boolean(),
        fc.subarray(PATTERN_POOL, { minLength: 1 }),
        async (host, port, connect, patterns) => {
          const lookups: string[] = [];
          const dials: { address: string; port: number }[] = [];
          const decisions: EgressDecision[] = [];
          const sock = path.join(dir, `p${n++}.sock`);
          const proxy = await EgressProxy.listen(sock, {
            allowedHosts: patterns,
            lookup: async (h) => {
              lookups.push(h);
              return [{ address: hostileResolve(h), family: 4 }];
            },
            dial: (address, p) => {
              dials.push({ address, port: p });
              return net.connect(echoPort, '127.0.0.1');
            },
            onDecision: (d) => decisions.push(d),
          });
          try {
            const line = connect ? `CONNECT ${host}:${port} HTTP/1.1` : `GET http://${host}:${port}/ HTTP/1.1`;
            const answer = await exchange(sock, `${line}\r\n\r\n`);
            const status = Number(answer.slice(9, 12));
            // The proxy reads the head as bytes (latin1): what it sees of a non-ASCII host.
            const seen = Buffer.from(host, 'utf8').toString('latin1');
            const parsed = connect ? parseConnectTarget(`${seen}:${port}`) : parseAbsoluteTarget(`http://${seen}:${port}/`);
            seenOutcomes.add(status === 400 ? 'malformed' : dials.length > 0 ? `dialled ${'host' in parsed && parsed.host.kind === 'name' ? 'name' : 'literal'}` : 'refused');
            if (status === 400) {
              expect(lookups).toEqual([]);
              expect(dials).toEqual([]);
              expect(decisions).toEqual([]);
              return;
            }
            // Not refused as malformed: the parser took it, and the proxy decided on what it parsed.
            expect('malformed' in parsed).toBe(false);
            if ('malformed' in parsed) return;
            expect(decisions).toHaveLength(1);
            const d = decisions[0]!;
            expect([d.host, d.port]).toEqual([parsed.host.host, parsed.port]);
            // Every name looked up is the checked one, well-formed and matching a pattern.
            for (const l of lookups) {
              expect(l).toBe(d.host);
              expect(parseHost(l)).toEqual({ kind: 'name', host: l });
            }
            expect(d.allowed).toBe(dials.length === 1);
            if (dials.length === 0) return;
            // The tunnel opened, or the request reached the echo upstream in origin form.
            if (connect) expect(status).toBe(200);
            // In origin form: the path (and query) of the URL as parsed. `?` or `#` in a generated host
            // ends the authority there, e.g. `http://a?:443/` is host `a`, port 80, path `/?:443/`.
            else expect(answer.startsWith(`GET ${'path' in parsed ? parsed.path : '?'} HTTP/1.1\r\n`)).toBe(true);
            expect(hostMatches(d.host, d.port, patterns)).toBe(true);
            expect(dials[0]!.port).toBe(parsed.port);
            if (parsed.host.kind === 'name') {
              expect(lookups).toEqual([d.host]);
              expect(dials[0]!.address).toBe(hostileResolve(d.host));
              expect(isPublicAddress(dials[0]!.address)).toBe(true);
            } else {
              expect(lookups).toEqual([]);
              expect(dials[0]!.address).toBe(parsed.host.host);
            }
          } finally {
            await proxy.close();
          }
        },
      ),
      { numRuns: 400 },
    );
    // The run covered each outcome (else the property above could hold vacuously).
    expect([...seenOutcomes].sort()).toEqual(['dialled literal', 'dialled name', 'malformed', 'refused']);
  }, 120_000);
});
