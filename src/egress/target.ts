/**
 * The egress proxy's parser of request targets: the host and port a program asks for, checked before
 * any allowed_hosts pattern sees them (issue 22 item 1). Hand-written rather than WHATWG `URL` on
 * purpose: `URL` repairs what it is given (IDNA mapping, percent-decoding, `0x7f.1` → `127.0.0.1`),
 * and getaddrinfo reads other things again (it stops at a NUL, takes `127.1` and `2130706433` as
 * addresses). A host that is not exactly one of the forms below is malformed: the proxy answers 400
 * and neither matches nor resolves it.
 *
 * - A name: ASCII letters, digits and hyphens (LDH) in dot-separated labels of 1–63 characters, none
 *   starting or ending with a hyphen, at most 253 characters; one trailing dot is dropped; lower-cased.
 *   Its last label may not look like a number (all digits, or `0x…`): such a name is an IPv4 address
 *   in a form other than the canonical one, and resolvers would take it as one.
 * - An IPv4 literal: canonical dotted quad only (four decimal parts 0–255, no leading zeros).
 * - An IPv6 literal: in brackets, hexadecimal digits, colons and dots only (so no zone `%eth0`).
 * - A port: 1–65535, decimal digits without leading zeros.
 * Nothing else: no control characters, NUL, `%`, `@` (credentials), spaces, Unicode (IDN or its
 * full-width dots `。．｡`); a program wanting an IDN sends its `xn--` form, as clients do.
 */
import net from 'node:net';

/** A host as checked and dialled: `host` is the normalised name or address (IPv6 without brackets). */
export type TargetHost = { kind: 'name' | 'ipv4' | 'ipv6'; host: string };

/** Why a target was refused (the text of the 400). */
export type Malformed = { malformed: string };

const IPV4_PART = '(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)';
const CANONICAL_IPV4 = new RegExp(`^${IPV4_PART}(?:\\.${IPV4_PART}){3}$`);
const LDH_LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
/** What WHATWG URL and inet_aton read as a number: the last label of an IPv4 address in any form. */
const NUMERIC_LABEL = /^(?:\d+|0x[0-9a-f]*)$/;

/** Why `name` (lower case, no trailing dot) is not an LDH DNS name, or null when it is one. */
export function dnsNameProblem(name: string): string | null {
  if (name === '') return 'empty name';
  if (name.length > 253) return 'name longer than 253 characters';
  const labels = name.split('.');
  for (const l of labels) {
    if (l === '') return 'empty label';
    if (l.length > 63) return 'label longer than 63 characters';
    if (!LDH_LABEL.test(l)) return 'only letters, digits and inner hyphens are allowed in a label';
  }
  if (NUMERIC_LABEL.test(labels[labels.length - 1]!)) return 'not a canonical IPv4 address (four decimal parts, no leading zeros)';
  return null;
}

/**
 * Parses a host as written in a request (`example.com`, `203.0.113.7`, `[2001:db8::1]`). The check
 * runs on the raw characters before lower-casing: `toLowerCase` maps some non-ASCII letters (the
 * Kelvin sign) onto ASCII ones.
 */
export function parseHost(raw: string): TargetHost | Malformed {
  const bad = (why: string): Malformed => ({ malformed: `malformed host ${JSON.stringify(raw)}: ${why}` });
  if (raw.startsWith('[')) {
    const inner = raw.endsWith(']') ? raw.slice(1, -1) : '';
    if (!/^[0-9A-Fa-f:.]+$/.test(inner) || net.isIP(inner) !== 6) return bad('not an IPv6 address in brackets (zones are not allowed)');
    return { kind: 'ipv6', host: inner.toLowerCase() };
  }
  if (CANONICAL_IPV4.test(raw)) return { kind: 'ipv4', host: raw };
  if (!/^[A-Za-z0-9.-]+$/.test(raw)) return bad('only ASCII letters, digits, hyphens and dots are allowed');
  const lower = raw.toLowerCase();
  const name = lower.endsWith('.') ? lower.slice(0, -1) : lower;
  const why = dnsNameProblem(name);
  return why === null ? { kind: 'name', host: name } : bad(why);
}

/** Parses a decimal port 1–65535 (no sign, no leading zero). */
export function parsePort(raw: string): number | Malformed {
  if (!/^[1-9]\d{0,4}$/.test(raw) || Number(raw) > 65535) return { malformed: `bad port ${raw}` };
  return Number(raw);
}

/** A target the proxy may act on: the host and port to check, and for plain HTTP the origin-form path. */
export interface ParsedTarget {
  host: TargetHost;
  port: number;
  /** Absolute-form only: path and query to send upstream (`/` when the URL had none). */
  path?: string;
}

/** Parses the target of `CONNECT host:port` (authority form). */
export function parseConnectTarget(target: string): ParsedTarget | Malformed {
  const t = /^(\[[^\]]+\]|[^:/[\]]+):(\d{1,5})$/.exec(target);
  if (!t) return { malformed: `CONNECT needs host:port, got ${target}` };
  const host = parseHost(t[1]!);
  if ('malformed' in host) return host;
  const port = parsePort(t[2]!);
  if (typeof port !== 'number') return port;
  return { host, port };
}

/** Parses an absolute-form target (`http://host[:port]/path?query`); other schemes are refused. */
export function parseAbsoluteTarget(target: string): ParsedTarget | Malformed {
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//.exec(target);
  if (!scheme) return { malformed: 'a proxied request needs an absolute http:// URL (use CONNECT for https)' };
  if (scheme[1]!.toLowerCase() !== 'http') return { malformed: `unsupported scheme ${scheme[1]!.toLowerCase()}: (use CONNECT for https)` };
  const rest = target.slice(scheme[0].length);
  const end = rest.search(/[/?#]/);
  const authority = end < 0 ? rest : rest.slice(0, end);
  let path = end < 0 ? '/' : rest.slice(end);
  if (authority.includes('@')) return { malformed: 'credentials in a proxied URL are not supported' };
  const a = /^(\[[^\]]*\]|[^:[\]]*)(?::(\d*))?$/.exec(authority);
  if (!a) return { malformed: `malformed host ${JSON.stringify(authority)}` };
  const host = parseHost(a[1]!);
  if ('malformed' in host) return host;
  const port = a[2] === undefined ? 80 : parsePort(a[2]);
  if (typeof port !== 'number') return port;
  const hash = path.indexOf('#');
  if (hash >= 0) path = path.slice(0, hash);
  if (path.startsWith('?') || path === '') path = `/${path}`;
  // The path goes upstream as it came; a control character in it would split or smuggle a request.
  if (/[\x00-\x20\x7f]/.test(path)) return { malformed: 'control characters in the URL path' };
  return { host, port, path };
}

/** The `Host` header value for a target: brackets around IPv6, the port unless it is 80. */
export function hostHeader(t: ParsedTarget): string {
  const h = t.host.kind === 'ipv6' ? `[${t.host.host}]` : t.host.host;
  return t.port === 80 ? h : `${h}:${t.port}`;
}
