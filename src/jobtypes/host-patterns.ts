/**
 * A job type's `allowed_hosts` patterns (SPEC: "a bridge network with an allowed-hosts list of
 * patterns"):
 * - `example.com` matches that name only; `*.example.com` any name below it, not the name itself;
 *   `*` any name;
 * - an IP literal (`203.0.113.7`, `2001:db8::1`, or bracketed `[2001:db8::1]`) matches that address only,
 *   and only a literal matches an address;
 * - `:port` after any of them (`api.github.com:443`, `[::1]:8080`) limits the pattern to that port.
 * Names compare case-insensitively, without a trailing dot. A name in a pattern follows the proxy's
 * rules for a requested host (src/egress/target.ts: LDH labels, length limits, no numeric last label),
 * so a pattern is never one the proxy could not match; {@link hostMatches} parses the requested host
 * with the same rules first and matches nothing malformed (a NUL, `%`, a non-canonical IPv4 form).
 */
import net from 'node:net';
import { dnsNameProblem, parseHost, type TargetHost } from '../egress/target.ts';

export interface HostPattern {
  /** Normalized name, `*.suffix`, `*`, or an IP address. */
  host: string;
  port: number | null;
}

/** A host as compared: lower case, no trailing dot, no IPv6 brackets. */
export function normalizeHost(host: string): string {
  let h = host.trim().toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h.endsWith('.')) h = h.slice(0, -1);
  return h;
}

/** Parses one pattern, or null when it is not one. */
export function parseHostPattern(raw: string): HostPattern | null {
  let s = raw.trim();
  let port: number | null = null;
  const bracketed = /^\[([^\]]+)\](?::(\d{1,5}))?$/.exec(s);
  if (bracketed) {
    if (net.isIP(bracketed[1]!) !== 6) return null;
    s = bracketed[1]!;
    if (bracketed[2] !== undefined) port = Number(bracketed[2]);
  } else if (net.isIP(s) === 0) {
    const withPort = /^(.*):(\d{1,5})$/.exec(s);
    if (withPort) {
      s = withPort[1]!;
      port = Number(withPort[2]);
    }
  }
  if (port !== null && !(port >= 1 && port <= 65535)) return null;
  const host = normalizeHost(s);
  if (host === '*') return s.trim() === '*' ? { host, port } : null; // not `*.`: a typo, not "anything"
  if (net.isIP(host) !== 0) return host.includes('%') ? null : { host, port };
  // At most one trailing dot (normalizeHost took it), as for a requested host.
  if (host.endsWith('.') || !/^[a-z0-9.*-]+$/.test(host)) return null;
  const name = host.startsWith('*.') ? host.slice(2) : host;
  return dnsNameProblem(name) === null ? { host, port } : null;
}

/** True when `raw` is a usable pattern. */
export function isHostPattern(raw: string): boolean {
  return parseHostPattern(raw) !== null;
}

/**
 * A requested host as matched: parsed by the proxy's rules; an unbracketed IPv6 address is taken
 * too (callers holding one already parsed). Null when malformed.
 */
function requestedHost(host: string): TargetHost | null {
  const t = host.trim();
  const parsed = parseHost(net.isIP(t) === 6 && !t.includes('%') ? `[${t}]` : t);
  return 'malformed' in parsed ? null : parsed;
}

/**
 * True when `host` (a name or an IP literal) on `port` matches one of `patterns` (invalid ones never
 * match). A host that is not a well-formed name or canonical IP literal matches nothing.
 */
export function hostMatches(host: string, port: number, patterns: string[]): boolean {
  const parsed = requestedHost(host);
  if (parsed === null) return false;
  const h = parsed.host;
  const literal = parsed.kind !== 'name';
  for (const raw of patterns) {
    const p = parseHostPattern(raw);
    if (!p || (p.port !== null && p.port !== port)) continue;
    if (net.isIP(p.host) !== 0) {
      if (literal && sameAddress(p.host, h)) return true;
    } else if (!literal) {
      if (p.host === '*' || p.host === h) return true;
      if (p.host.startsWith('*.') && h.length > p.host.length - 1 && h.endsWith(p.host.slice(1))) return true;
    }
  }
  return false;
}

function sameAddress(a: string, b: string): boolean {
  if (a === b) return true;
  const kind = net.isIP(a);
  if (kind !== net.isIP(b)) return false;
  const list = new net.BlockList();
  list.addAddress(a, kind === 4 ? 'ipv4' : 'ipv6');
  return list.check(b, kind === 4 ? 'ipv4' : 'ipv6');
}
