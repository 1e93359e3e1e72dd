/**
 * Where a callback may go (issue 21, "No SSRF"). Two checks, one rule set:
 *
 * - At submission ({@link checkCallbackUrl}): an absolute `http(s)` URL without credentials whose host
 *   and port match `webhooks.allowed_hosts` (the egress patterns of jobtypes/host-patterns.ts: a name
 *   pattern matches names only, an IP pattern the address it names). Anything else is a 400 that says
 *   which rule it broke.
 * - At send time ({@link resolveTarget}): the URL is matched again (the list may have changed), a name
 *   is resolved once and refused when any of its addresses is loopback, private, link-local, CGNAT or
 *   otherwise non-public (src/egress/addresses.ts), unless `allow_private_addresses` is set. An IP
 *   written in the URL passed the pattern check, which only an IP pattern naming it can do: the
 *   operator allowed that address explicitly. The request then dials the address that was checked
 *   (the sender's `lookup` answers with it), so DNS cannot answer differently a second time.
 */
import { promises as dns } from 'node:dns';
import net from 'node:net';
import { AppError } from '../errors.ts';
import { isPublicAddress } from '../egress/addresses.ts';
import { hostMatches } from '../jobtypes/host-patterns.ts';

/** Longest accepted callback URL. */
export const MAX_CALLBACK_URL_LENGTH = 2048;

/** Resolves a name to its addresses (dns.lookup with `all`); tests pass their own. */
export type Lookup = (host: string) => Promise<{ address: string; family: number }[]>;

export const defaultLookup: Lookup = (host) => dns.lookup(host, { all: true, verbatim: true });

/** The rules a URL is checked against (from `webhooks`). */
export interface CallbackRules {
  allowed_hosts: readonly string[];
  allow_private_addresses: boolean;
}

/** A parsed, allowed callback URL. */
export interface CallbackUrl {
  url: URL;
  /** The host as matched and dialled: a lower-case name, or an address (IPv6 without brackets). */
  host: string;
  port: number;
  isAddress: boolean;
}

/** Why `raw` may not be a callback URL under `rules`, or the parsed URL. */
export function parseCallbackUrl(raw: string, rules: Pick<CallbackRules, 'allowed_hosts'>): CallbackUrl | { problem: string } {
  if (raw.length > MAX_CALLBACK_URL_LENGTH) return { problem: `must be at most ${MAX_CALLBACK_URL_LENGTH} characters` };
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return { problem: 'must be an absolute http:// or https:// URL' };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return { problem: `must use http or https, not ${url.protocol.replace(/:$/, '')}` };
  if (url.username !== '' || url.password !== '') return { problem: 'must not carry credentials (user:password@); put a token in the path or query, or verify the signature' };
  const host = url.hostname.replace(/^\[|\]$/g, '').toLowerCase();
  const port = url.port !== '' ? Number(url.port) : url.protocol === 'https:' ? 443 : 80;
  if (rules.allowed_hosts.length === 0) return { problem: 'callbacks are not enabled on this service (webhooks.allowed_hosts is empty)' };
  if (!hostMatches(host, port, [...rules.allowed_hosts])) {
    return { problem: `host ${url.host} does not match webhooks.allowed_hosts (${rules.allowed_hosts.join(', ')})` };
  }
  return { url, host, port, isAddress: net.isIP(host) !== 0 };
}

/** The submission check: the parsed URL, or a 400 naming the field and the rule. */
export function checkCallbackUrl(raw: string, rules: Pick<CallbackRules, 'allowed_hosts'>, field = 'callback_url'): CallbackUrl {
  const r = parseCallbackUrl(raw, rules);
  if ('problem' in r) throw new AppError('validation_error', `${field}: ${r.problem}`);
  return r;
}

/** Where an attempt goes: the URL and the one address it is dialled at. */
export interface ResolvedTarget {
  url: URL;
  address: string;
  family: 4 | 6;
}

/** The send-time check (see the module comment): the address to dial, or why not. */
export async function resolveTarget(raw: string, rules: CallbackRules, lookup: Lookup = defaultLookup): Promise<ResolvedTarget | { refused: string }> {
  const parsed = parseCallbackUrl(raw, rules);
  if ('problem' in parsed) return { refused: parsed.problem };
  if (parsed.isAddress) return { url: parsed.url, address: parsed.host, family: net.isIP(parsed.host) as 4 | 6 };
  let addrs: { address: string; family: number }[];
  try {
    addrs = await lookup(parsed.host);
  } catch (err) {
    // Not a refusal: a resolver failure may pass, so the attempt is retried.
    throw new Error(`cannot resolve ${parsed.host}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  if (addrs.length === 0) throw new Error(`cannot resolve ${parsed.host}: no addresses`);
  if (!rules.allow_private_addresses) {
    const bad = addrs.find((a) => !isPublicAddress(a.address));
    if (bad) return { refused: `${parsed.host} resolves to ${bad.address}, a loopback, private or link-local address (set webhooks.allow_private_addresses, or list the address itself in webhooks.allowed_hosts)` };
  }
  const first = addrs[0]!;
  return { url: parsed.url, address: first.address, family: (first.family === 6 ? 6 : 4) as 4 | 6 };
}
