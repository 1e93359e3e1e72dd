/**
 * The non-public ranges of src/egress/addresses.ts at their edges: the first and last address of each
 * range is refused, the address just outside it is public. (test/unit/runtime/local/egress-proxy.test.ts
 * checks one address inside most ranges.)
 */
import { describe, expect, it } from 'vitest';
import { isPublicAddress } from '../../../src/egress/addresses.ts';

describe('isPublicAddress at the edges of each range', () => {
  it.each<[string, string, string, string[]]>([
    ['this network', '0.0.0.0', '0.255.255.255', ['1.0.0.0']],
    ['private 10/8', '10.0.0.0', '10.255.255.255', ['9.255.255.255', '11.0.0.0']],
    ['CGNAT', '100.64.0.0', '100.127.255.255', ['100.63.255.255', '100.128.0.0']],
    ['loopback', '127.0.0.0', '127.255.255.255', ['126.255.255.255', '128.0.0.0']],
    ['link-local', '169.254.0.0', '169.254.255.255', ['169.253.255.255', '169.255.0.0']],
    ['private 172.16/12', '172.16.0.0', '172.31.255.255', ['172.15.255.255', '172.32.0.0']],
    ['IETF protocol assignments', '192.0.0.0', '192.0.0.255', ['192.0.1.0']],
    ['TEST-NET-1', '192.0.2.0', '192.0.2.255', ['192.0.3.0']],
    ['6to4 relay anycast', '192.88.99.0', '192.88.99.255', ['192.88.98.255', '192.88.100.0']],
    ['private 192.168/16', '192.168.0.0', '192.168.255.255', ['192.167.255.255', '192.169.0.0']],
    ['benchmarking', '198.18.0.0', '198.19.255.255', ['198.17.255.255', '198.20.0.0']],
    ['TEST-NET-2', '198.51.100.0', '198.51.100.255', ['198.51.99.255', '198.51.101.0']],
    ['TEST-NET-3', '203.0.113.0', '203.0.113.255', ['203.0.112.255', '203.0.114.0']],
    ['multicast and reserved', '224.0.0.0', '255.255.255.255', ['223.255.255.255']],
    ['IPv4-compatible and unspecified', '::', '::ffff:ffff', ['::1:0:0:0']],
    ['loopback v6', '::1', '::1', []],
    ['unique local', 'fc00::', 'fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', ['fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'fe00::']],
    ['link-local v6', 'fe80::', 'febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff', ['fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff']],
    ['site-local (deprecated)', 'fec0::', 'feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', []],
    ['multicast v6', 'ff00::', 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', []],
    ['documentation v6', '2001:db8::', '2001:db8:ffff:ffff:ffff:ffff:ffff:ffff', ['2001:db7:ffff:ffff:ffff:ffff:ffff:ffff', '2001:db9::']],
    ['NAT64', '64:ff9b::', '64:ff9b::ffff:ffff', ['64:ff9b::1:0:0']],
    ['local-use NAT64', '64:ff9b:1::', '64:ff9b:1:ffff:ffff:ffff:ffff:ffff', ['64:ff9b:2::']],
    ['discard-only', '100::', '100::ffff:ffff:ffff:ffff', ['100:0:0:1::']],
  ])('%s: %s … %s refused, just outside public', (_name, first, last, outside) => {
    expect([isPublicAddress(first), isPublicAddress(last)]).toEqual([false, false]);
    for (const o of outside) expect(isPublicAddress(o), o).toBe(true);
  });

  it('IPv4-mapped IPv6 is judged as its IPv4 address, in either notation', () => {
    expect(isPublicAddress('::ffff:10.1.2.3')).toBe(false);
    expect(isPublicAddress('::ffff:a01:203')).toBe(false);
    expect(isPublicAddress('::FFFF:8.8.8.8')).toBe(true);
    expect(isPublicAddress('::ffff:808:808')).toBe(true);
  });

  it('an address with a zone, or no address at all, is not public', () => {
    for (const s of ['2606:4700::1111%eth0', 'fe80::1%1', '8.8.8.8 ', '08.8.8.8', 'example.com', '']) expect(isPublicAddress(s), s).toBe(false);
  });
});
