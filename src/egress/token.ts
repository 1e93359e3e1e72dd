/**
 * Per-run credentials of the cluster's egress proxy. The proxy serves every run pod of a release on
 * one TCP port, so each connection must say which run it belongs to and which hosts that run may
 * reach. The service signs that in a stateless token; the proxy checks the signature and needs no
 * database, no Kubernetes API and no state shared with the service beyond one key (a chart-generated
 * Secret mounted in both).
 *
 * Token: `v1.<payload>.<mac>`, both parts base64url (no padding):
 * - payload: JSON `{ "e": execution id, "h": allowed_hosts patterns, "x": expiry, epoch seconds }`;
 * - mac: HMAC-SHA256 over `v1.<payload>` with the shared key.
 * The run pod gets it as the password of its proxy URL (`http://<execution id>:<token>@proxy:port`),
 * which clients send as `Proxy-Authorization: Basic …`. The user name must equal the token's execution
 * id. Anyone who can read the run's Job can reuse its token until it expires, but only for that run's
 * own hosts: it grants nothing the run's job type does not already allow. Hand-written (a few lines
 * of node:crypto): a JWT library would bring algorithm negotiation this needs none of.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

/** What a token grants: a run's id, its host patterns, and until when. */
export interface EgressGrant {
  executionId: string;
  allowedHosts: string[];
  /** Expiry, milliseconds since the epoch (stored to the second, rounded up). */
  expiresAtMs: number;
}

const VERSION = 'v1';
/** Shortest key accepted: 32 bytes (the chart generates 48 random characters). */
export const MIN_KEY_BYTES = 32;

function mac(key: Buffer | string, data: string): Buffer {
  return createHmac('sha256', key).update(data).digest();
}

function checkKey(key: Buffer | string): void {
  if (Buffer.byteLength(key) < MIN_KEY_BYTES) throw new Error(`egress proxy key: at least ${MIN_KEY_BYTES} bytes needed`);
}

/** Signs a grant. Pure: the same grant and key give the same token. */
export function signEgressToken(grant: EgressGrant, key: Buffer | string): string {
  checkKey(key);
  const payload = Buffer.from(JSON.stringify({ e: grant.executionId, h: grant.allowedHosts, x: Math.ceil(grant.expiresAtMs / 1000) }), 'utf8').toString('base64url');
  const signed = `${VERSION}.${payload}`;
  return `${signed}.${mac(key, signed).toString('base64url')}`;
}

/** Why a token was not accepted. */
export type TokenRefusal = 'malformed' | 'bad signature' | 'expired';

/** The grant of a valid, unexpired token, or why not. */
export function verifyEgressToken(token: string, key: Buffer | string, nowMs: number): { grant: EgressGrant } | { refused: TokenRefusal } {
  const parts = token.split('.');
  if (parts.length !== 3 || parts[0] !== VERSION || !/^[A-Za-z0-9_-]+$/.test(parts[1]!) || !/^[A-Za-z0-9_-]+$/.test(parts[2]!)) return { refused: 'malformed' };
  const expected = mac(key, `${parts[0]}.${parts[1]}`);
  const given = Buffer.from(parts[2]!, 'base64url');
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return { refused: 'bad signature' };
  let body: unknown;
  try {
    body = JSON.parse(Buffer.from(parts[1]!, 'base64url').toString('utf8'));
  } catch {
    return { refused: 'malformed' };
  }
  const b = body as { e?: unknown; h?: unknown; x?: unknown };
  if (typeof b.e !== 'string' || b.e === '' || !Array.isArray(b.h) || !b.h.every((p) => typeof p === 'string') || typeof b.x !== 'number' || !Number.isFinite(b.x)) {
    return { refused: 'malformed' };
  }
  const expiresAtMs = b.x * 1000;
  if (nowMs >= expiresAtMs) return { refused: 'expired' };
  return { grant: { executionId: b.e, allowedHosts: b.h as string[], expiresAtMs } };
}

/** The proxy URL a run pod gets: `base` (`http://host:port`) with the execution id and token as credentials. */
export function egressProxyUrl(base: string, grant: EgressGrant, key: Buffer | string): string {
  const url = new URL(base);
  url.username = encodeURIComponent(grant.executionId);
  url.password = signEgressToken(grant, key);
  return url.toString().replace(/\/$/, '');
}

/**
 * Reads `Proxy-Authorization: Basic base64(user:token)` and checks the token: the grant, or why not.
 * A missing header is `missing`.
 */
export function authenticateProxyRequest(
  header: string | undefined,
  key: Buffer | string,
  nowMs: number,
): { grant: EgressGrant } | { refused: TokenRefusal | 'missing' | 'user does not match' } {
  if (header === undefined) return { refused: 'missing' };
  const m = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header.trim());
  if (!m) return { refused: 'malformed' };
  const decoded = Buffer.from(m[1]!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 0) return { refused: 'malformed' };
  const r = verifyEgressToken(decoded.slice(colon + 1), key, nowMs);
  if ('refused' in r) return r;
  if (decoded.slice(0, colon) !== r.grant.executionId) return { refused: 'user does not match' };
  return r;
}
