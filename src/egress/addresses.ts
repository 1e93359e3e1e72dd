/**
 * Which addresses a host name may lead the egress proxy to: public unicast ones only. Loopback,
 * private (RFC 1918, unique-local), link-local (cloud metadata at 169.254.169.254), CGNAT (often a
 * cluster's pod or service range), multicast, documentation, benchmarking and reserved ranges are
 * reachable only through an allowed_hosts entry that names the address itself.
 */
import net from 'node:net';

/** Non-public address ranges: never reached through a host name. */
const NON_PUBLIC = (() => {
  const b = new net.BlockList();
  for (const [a, p] of [
    ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12],
    ['192.0.0.0', 24], ['192.0.2.0', 24], ['192.88.99.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['198.51.100.0', 24], ['203.0.113.0', 24],
    ['224.0.0.0', 4], ['240.0.0.0', 4],
  ] as const) b.addSubnet(a, p, 'ipv4');
  for (const [a, p] of [
    ['::', 96], ['::1', 128], ['fc00::', 7], ['fe80::', 10], ['fec0::', 10], ['ff00::', 8], ['2001:db8::', 32], ['64:ff9b::', 96], ['64:ff9b:1::', 48], ['100::', 64],
  ] as const) {
    b.addSubnet(a, p, 'ipv6');
  }
  return b;
})();

/**
 * True when `ip` is a public unicast address. IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`,
 * `::ffff:a00:1`) are judged as IPv4: BlockList checks them against the IPv4 ranges.
 */
export function isPublicAddress(ip: string): boolean {
  const kind = net.isIP(ip);
  if (kind === 4) return !NON_PUBLIC.check(ip, 'ipv4');
  if (kind !== 6 || ip.includes('%')) return false;
  return !NON_PUBLIC.check(ip, 'ipv6');
}
