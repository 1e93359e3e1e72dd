/**
 * DNS rebinding and cross-site requests against the local default (issue 22 item 7). Without API
 * tokens anyone who can reach the port can run code, which is acceptable only because the default
 * listens on loopback. A web page can still reach loopback through the visitor's browser:
 *
 * - by DNS rebinding: `rebind.attacker.example` first resolves to the attacker and then to
 *   127.0.0.1, so the page's same-origin requests land here, with `Host: rebind.attacker.example`;
 * - by a cross-site "simple" request (a form or `text/plain` POST), which the browser sends without
 *   asking, carrying `Origin` and `Sec-Fetch-Site` of the page.
 *
 * So, with authentication off: a request whose Host is not a loopback name (`localhost`,
 * `127.x.x.x`, `[::1]`, any port) nor in `http.allowed_hosts` is refused (403); and a state-changing
 * request (anything but GET/HEAD/OPTIONS) whose `Sec-Fetch-Site` is not `same-origin`/`none`, or whose
 * `Origin` is not the request's own, is refused (403). The probes (`/livez`, `/readyz`, `/health`)
 * answer from any Host, so a kubelet or load balancer probing by IP keeps working; `/health` gives
 * its details only to an allowed Host (`principal` = `local`). With tokens configured none of this
 * applies: a browser does not attach a bearer token by itself, and the token is the check.
 *
 * Our own code: hono has a CSRF helper (Origin only) but no Host allow-list; the rule here needs both,
 * plus Sec-Fetch-Site, decided by the pure functions below.
 */
import type { MiddlewareHandler } from 'hono';
import { AppError } from '../../errors.ts';
import type { AppEnv } from '../deps.ts';
import { errorResponse } from '../errors.ts';
import { requestHeader } from '../request-header.ts';
import { SHARED_KEY } from '../stream-limits.ts';
import { OPEN_PATHS } from './auth.ts';

/** The name part of a Host header value (`name[:port]`, `[v6][:port]`), lower case, no trailing dot; null when malformed. */
export function hostName(header: string): string | null {
  const h = header.trim().toLowerCase();
  const m = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(h);
  if (!m) return null;
  const name = m[1]!.replace(/\.$/, '');
  return name === '' ? null : name;
}

/** Whether a host name (from {@link hostName}) is a loopback name. */
export function isLoopbackName(name: string): boolean {
  return name === 'localhost' || name === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(name);
}

/** Whether a Host header value is answered without authentication: loopback, or matched by an `http.allowed_hosts` entry. */
export function hostAllowed(header: string | undefined, allowed: readonly string[]): boolean {
  if (allowed.includes('*')) return true;
  const name = header === undefined ? null : hostName(header);
  if (name === null) return false;
  if (isLoopbackName(name)) return true;
  return allowed.some((entry) => {
    const e = entry.toLowerCase().replace(/\.$/, '');
    return e.startsWith('*.') ? name.endsWith(e.slice(1)) && name.length > e.length - 1 : name === e;
  });
}

/** Methods that change nothing: no cross-site check. */
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/** `host[:port]` without the scheme's default port, lower case. */
function authority(host: string, scheme: 'http' | 'https' | null): string {
  const h = host.trim().toLowerCase().replace(/\.(?=:|$)/, '');
  if (scheme === 'http' || scheme === null) return h.replace(/:80$/, '');
  return h.replace(/:443$/, '');
}

/**
 * Why a state-changing request is cross-site, or null when it is not (or `method` changes nothing).
 * `Sec-Fetch-Site` must be `same-origin` or `none` (typed by the user); `Origin` must name the
 * request's own Host. A request with neither (curl, a script, an SDK) passes: it was not sent by a
 * page on another site, which would have carried them.
 */
export function crossSiteReason(req: { method: string; host: string | undefined; origin: string | undefined; fetchSite: string | undefined }): string | null {
  if (SAFE_METHODS.has(req.method.toUpperCase())) return null;
  const site = req.fetchSite?.trim().toLowerCase();
  if (site !== undefined && site !== 'same-origin' && site !== 'none') return `Sec-Fetch-Site is '${site.slice(0, 20)}'`;
  if (req.origin === undefined) return null;
  const origin = req.origin.trim();
  if (origin === 'null') return "Origin is 'null' (an opaque origin)";
  let url: URL;
  try {
    url = new URL(origin);
  } catch {
    return `Origin '${origin.slice(0, 100)}' is not a URL`;
  }
  const scheme = url.protocol === 'https:' ? 'https' : url.protocol === 'http:' ? 'http' : null;
  if (scheme === null || req.host === undefined) return `Origin '${origin.slice(0, 100)}' is not this service`;
  // The service does not know whether a proxy in front of it terminates TLS: the port decides.
  if (authority(url.host, scheme) !== authority(req.host, scheme)) return `Origin '${origin.slice(0, 100)}' is not this service's (${req.host.slice(0, 100)})`;
  return null;
}

/** The middleware (install it only when authentication is off). */
export function hostGuard(allowedHosts: readonly string[]): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const host = requestHeader(c, 'host') ?? hostOfUrl(c.req.url);
    const allowed = hostAllowed(host, allowedHosts);
    if (allowed) c.set('principal', SHARED_KEY);
    if (OPEN_PATHS.has(c.req.path)) return next();
    if (!allowed) {
      const shown = (host ?? '(none)').slice(0, 100);
      return errorResponse(
        new AppError(
          'forbidden',
          `Host '${shown}' is not allowed: without authentication this service answers only loopback names (localhost, 127.0.0.1, [::1]) and the names in http.allowed_hosts (SVC_ALLOWED_HOSTS); add this name there, or configure API tokens`,
        ),
        c,
      );
    }
    const why = crossSiteReason({ method: c.req.method, host, origin: requestHeader(c, 'origin'), fetchSite: requestHeader(c, 'sec-fetch-site') });
    if (why) return errorResponse(new AppError('forbidden', `cross-site request refused: ${why}; without authentication only same-origin pages and non-browser clients may change state`), c);
    return next();
  };
}

function hostOfUrl(url: string): string | undefined {
  try {
    return new URL(url).host;
  } catch {
    return undefined;
  }
}
