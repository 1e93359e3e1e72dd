/** The Host and cross-site rules of the local default (issue 22 item 7), as tables over the pure functions. */
import { describe, expect, it } from 'vitest';
import { crossSiteReason, hostAllowed, hostName } from '../../../src/api/middleware/host-guard.ts';
import { isJsonType } from '../../../src/api/middleware/body-rules.ts';
import { parseConfig } from '../../../src/config.ts';

describe('hostName', () => {
  it.each([
    ['localhost:8000', 'localhost'],
    ['LOCALHOST', 'localhost'],
    ['localhost.:8000', 'localhost'],
    ['127.0.0.1', '127.0.0.1'],
    ['[::1]:8000', '[::1]'],
    ['sandpod.sandpod.svc:8000', 'sandpod.sandpod.svc'],
    ['', null],
    ['a:b:c', null],
    ['[::1', null],
    ['host:99999999', null],
    ['user@host', 'user@host'],
  ])('%j → %j', (header, name) => {
    expect(hostName(header)).toBe(name);
  });
});

describe('hostAllowed', () => {
  it.each([
    ['localhost:8000', [], true],
    ['127.0.0.1:1', [], true],
    ['127.9.8.7', [], true],
    ['[::1]:8000', [], true],
    ['rebind.attacker.example', [], false],
    ['localhost.attacker.example', [], false],
    ['127.0.0.1.attacker.example', [], false],
    ['attacker.example:8000', ['localhost'], false],
    ['0.0.0.0:8000', [], false],
    ['[::ffff:127.0.0.1]', [], false],
    ['192.168.1.10:8000', [], false],
    ['192.168.1.10:8000', ['192.168.1.10'], true],
    ['sandpod.internal:8000', ['sandpod.internal'], true],
    ['SANDPOD.internal.', ['sandpod.internal'], true],
    ['api.sandpod.svc.cluster.local', ['*.svc.cluster.local'], true],
    ['svc.cluster.local', ['*.svc.cluster.local'], false],
    ['evilsvc.cluster.local', ['*.svc.cluster.local'], false],
    ['anything.example', ['*'], true],
    [undefined, [], false],
  ] as const)('%j with %j → %s', (header, allowed, ok) => {
    expect(hostAllowed(header, allowed)).toBe(ok);
  });
});

describe('crossSiteReason', () => {
  const host = '127.0.0.1:8000';
  it.each([
    ['GET', 'http://evil.example', 'cross-site', false],
    ['POST', undefined, undefined, false],
    ['POST', 'http://127.0.0.1:8000', 'same-origin', false],
    ['POST', undefined, 'none', false],
    ['POST', 'http://127.0.0.1:8000', undefined, false],
    ['POST', 'http://evil.example', 'cross-site', true],
    ['POST', undefined, 'cross-site', true],
    ['POST', 'http://localhost:3000', 'same-site', true],
    ['POST', 'http://127.0.0.1:3000', undefined, true],
    ['POST', 'http://evil.example', undefined, true],
    ['POST', 'null', undefined, true],
    ['POST', 'not a url', undefined, true],
    ['DELETE', 'http://evil.example', undefined, true],
    ['PUT', 'file://', undefined, true],
  ] as const)('%s Origin %j Sec-Fetch-Site %j → cross-site %s', (method, origin, fetchSite, refused) => {
    const why = crossSiteReason({ method, host, origin, fetchSite });
    expect(why !== null).toBe(refused);
  });

  it('a proxy terminating TLS: https origin on the default port matches a Host without a port', () => {
    expect(crossSiteReason({ method: 'POST', host: 'sandpod.example', origin: 'https://sandpod.example', fetchSite: 'same-origin' })).toBeNull();
    expect(crossSiteReason({ method: 'POST', host: 'sandpod.example:443', origin: 'https://sandpod.example', fetchSite: undefined })).toBeNull();
  });
});

describe('isJsonType', () => {
  it.each([
    ['application/json', true],
    ['application/json; charset=utf-8', true],
    ['Application/JSON', true],
    ['application/problem+json', true],
    ['application/jsonx', false],
    ['text/plain', false],
    ['application/x-www-form-urlencoded', false],
    ['multipart/form-data; boundary=x', false],
    [undefined, false],
  ] as const)('%j → %s', (type, ok) => {
    expect(isJsonType(type)).toBe(ok);
  });
});

describe('http configuration', () => {
  it('defaults, SVC_ALLOWED_HOSTS, and bad entries named', () => {
    const d = parseConfig({}, {});
    expect(d.http).toEqual({ allowed_hosts: [], max_event_streams: 256, max_event_streams_per_token: 32 });
    expect(parseConfig({ http: { allowed_hosts: ['a.example'] } }, { SVC_ALLOWED_HOSTS: 'sandpod.internal, *.svc.cluster.local' }).http.allowed_hosts).toEqual([
      'sandpod.internal',
      '*.svc.cluster.local',
    ]);
    expect(() => parseConfig({ http: { allowed_hosts: ['host:8000'] } }, {})).toThrow(/http\.allowed_hosts\.0: must be a host name/);
    expect(() => parseConfig({ http: { allowed_hosts: ['http://x'] } }, {})).toThrow(/http\.allowed_hosts/);
    expect(() => parseConfig({ http: { max_event_streams: 0 } }, {})).toThrow(/http\.max_event_streams/);
  });
});
