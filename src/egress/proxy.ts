/**
 * The egress proxy of `bridge` job types that list `allowed_hosts`, in two settings (one implementation):
 * - Local runtime: the sandbox gets no network of its own (like `none`), only a Unix socket to this
 *   HTTP proxy, one per run ({@link EgressProxy.listen}). The runner relays a loopback port inside the
 *   sandbox to the socket and points `HTTP(S)_PROXY` at that port, so proxy-aware clients (urllib,
 *   requests, pip, curl) work; nothing else leaves the sandbox.
 * - Cluster: one proxy on a TCP port serves every run pod of a release ({@link EgressProxy.listenTcp},
 *   src/egress/main.ts). Each request names its run with a per-run credential (`Proxy-Authorization`,
 *   see token.ts); the proxy applies that run's patterns, and answers `407` without a valid one.
 *
 * The proxy serves `CONNECT host:port` (HTTPS and any TCP) and absolute-form plain HTTP requests
 * (`GET http://host/…`). A request goes out only when its host and port match a pattern (see
 * jobtypes/host-patterns.ts), and:
 * - A name is resolved here, and refused when any of its addresses is not public (loopback,
 *   private, link-local, CGNAT, multicast, …): a pattern cannot be turned against the host or its
 *   network by DNS. The connection goes to the address that was checked (no second lookup).
 * - An address written literally in the list is allowed whatever its kind: the operator named it.
 * Refusals are `403` with a one-line reason, which the program sees as an HTTP or tunnel error.
 */
import { promises as dns } from 'node:dns';
import { chmodSync } from 'node:fs';
import net from 'node:net';
import { hostMatches, normalizeHost } from '../jobtypes/host-patterns.ts';

/** Resolves a name to its addresses (dns.lookup with `all`). */
export type Lookup = (host: string) => Promise<{ address: string; family: number }[]>;

export interface EgressDecision {
  /** The run the request belongs to (shared proxy only). */
  executionId?: string;
  host: string;
  port: number;
  allowed: boolean;
  reason?: string;
}

/** Who a request is, from its `Proxy-Authorization` header: a run and its patterns, or why not. */
export type Authenticate = (proxyAuthorization: string | undefined) => { executionId: string; allowedHosts: string[] } | { refused: string };

export interface EgressProxyOptions {
  /** The job type's `allowed_hosts` (a proxy of one run). Ignored with `authenticate`. */
  allowedHosts?: string[];
  /** A proxy shared by runs: each request's run and patterns come from its credential; none valid → 407. */
  authenticate?: Authenticate;
  lookup?: Lookup;
  /** Called once per request with what was decided (for logs and counts). */
  onDecision?: (d: EgressDecision) => void;
  connectTimeoutMs?: number;
  /** Most connections open at once; more are refused with 503. */
  maxConnections?: number;
}

const MAX_HEAD_BYTES = 16 * 1024;
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'te', 'trailer', 'upgrade']);
const defaultLookup: Lookup = (host) => dns.lookup(host, { all: true, verbatim: true });

/** Non-public address ranges: never reached through a host name. */
const NON_PUBLIC = (() => {
  const b = new net.BlockList();
  for (const [a, p] of [
    ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12],
    ['192.0.0.0', 24], ['192.0.2.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['198.51.100.0', 24], ['203.0.113.0', 24],
    ['224.0.0.0', 4], ['240.0.0.0', 4],
  ] as const) b.addSubnet(a, p, 'ipv4');
  for (const [a, p] of [['::', 128], ['::1', 128], ['fc00::', 7], ['fe80::', 10], ['ff00::', 8], ['2001:db8::', 32], ['64:ff9b::', 96], ['100::', 64]] as const) {
    b.addSubnet(a, p, 'ipv6');
  }
  return b;
})();

/** True when `ip` is a public unicast address. IPv4-mapped IPv6 addresses are judged as IPv4. */
export function isPublicAddress(ip: string): boolean {
  const kind = net.isIP(ip);
  if (kind === 4) return !NON_PUBLIC.check(ip, 'ipv4');
  if (kind !== 6) return false;
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  if (mapped) return isPublicAddress(mapped[1]!);
  return !NON_PUBLIC.check(ip, 'ipv6');
}

/** One run's proxy, listening on a Unix socket. */
export class EgressProxy {
  private readonly sockets = new Set<net.Socket>();
  private clients = 0;
  private readonly lookup: Lookup;

  private constructor(
    private readonly server: net.Server,
    private readonly o: EgressProxyOptions,
  ) {
    this.lookup = o.lookup ?? defaultLookup;
    server.on('connection', (s) => this.accept(s));
  }

  /** Listens on `socketPath` (mode 0666: the sandbox user connects to it). */
  static async listen(socketPath: string, o: EgressProxyOptions): Promise<EgressProxy> {
    const proxy = await EgressProxy.start({ path: socketPath }, o);
    chmodSync(socketPath, 0o666);
    return proxy;
  }

  /** Listens on a TCP `port` (0: any free one, see {@link port}) of `host`; meant with `authenticate`. */
  static async listenTcp(port: number, host: string, o: EgressProxyOptions): Promise<EgressProxy> {
    return EgressProxy.start({ port, host }, o);
  }

  private static async start(where: net.ListenOptions, o: EgressProxyOptions): Promise<EgressProxy> {
    const server = net.createServer();
    const proxy = new EgressProxy(server, o);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(where, () => {
        server.off('error', reject);
        resolve();
      });
    });
    return proxy;
  }

  /** The TCP port listened on (0 on a Unix socket). */
  get port(): number {
    const a = this.server.address();
    return a !== null && typeof a === 'object' ? a.port : 0;
  }

  /** Stops listening and cuts every connection (the run is over). */
  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private track(s: net.Socket): void {
    this.sockets.add(s);
    s.once('close', () => this.sockets.delete(s));
    s.on('error', () => s.destroy());
  }

  private accept(client: net.Socket): void {
    this.track(client);
    this.clients++;
    client.once('close', () => this.clients--);
    if (this.clients > (this.o.maxConnections ?? 64)) return answer(client, 503, 'too many connections through the egress proxy');
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length > MAX_HEAD_BYTES) {
          client.off('data', onData);
          answer(client, 431, 'request head too large');
        }
        return;
      }
      client.off('data', onData);
      client.pause();
      // Nothing a sandboxed program sends may take the service down: any failure ends its connection.
      this.handle(client, head.subarray(0, end).toString('latin1'), head.subarray(end + 4)).catch(() => client.destroy());
    };
    client.on('data', onData);
  }

  private async handle(client: net.Socket, head: string, rest: Buffer): Promise<void> {
    const lines = head.split('\r\n');
    const m = /^([A-Z]+) (\S+) HTTP\/1\.[01]$/.exec(lines[0] ?? '');
    if (!m) return answer(client, 400, 'not an HTTP/1.x proxy request');
    const [, method, target] = m as unknown as [string, string, string];
    let host: string;
    let port: number;
    let forward: Buffer | null = null;
    if (method === 'CONNECT') {
      const t = /^(\[[^\]]+\]|[^:/]+):(\d{1,5})$/.exec(target);
      if (!t) return answer(client, 400, `CONNECT needs host:port, got ${target}`);
      host = normalizeHost(t[1]!);
      port = Number(t[2]);
    } else {
      let url: URL;
      try {
        url = new URL(target);
      } catch {
        return answer(client, 400, 'a proxied request needs an absolute http:// URL (use CONNECT for https)');
      }
      if (url.protocol !== 'http:') return answer(client, 400, `unsupported scheme ${url.protocol} (use CONNECT for https)`);
      host = normalizeHost(url.hostname);
      port = Number(url.port || 80);
      const name = (l: string) => l.slice(0, l.indexOf(':')).trim().toLowerCase();
      // Hop-by-hop: the fixed list and whatever the Connection header names.
      const named = lines.filter((l) => name(l) === 'connection').flatMap((l) => l.slice(l.indexOf(':') + 1).split(',').map((t) => t.trim().toLowerCase()));
      // Host is the URL's: another name in it could reach a different site on a shared address.
      const headers = lines.slice(1).filter((l) => !HOP_BY_HOP.has(name(l)) && !named.includes(name(l)) && name(l) !== 'host');
      forward = Buffer.concat([Buffer.from(`${method} ${url.pathname}${url.search} HTTP/1.1\r\n${[`Host: ${url.host}`, ...headers, 'Connection: close'].join('\r\n')}\r\n\r\n`, 'latin1'), rest]);
    }
    if (!(port >= 1 && port <= 65535)) return answer(client, 400, `bad port ${port}`);
    let allowedHosts = this.o.allowedHosts ?? [];
    let who: { executionId?: string } = {};
    if (this.o.authenticate) {
      const auth = lines.slice(1).find((l) => l.slice(0, l.indexOf(':')).trim().toLowerCase() === 'proxy-authorization');
      const r = this.o.authenticate(auth === undefined ? undefined : auth.slice(auth.indexOf(':') + 1).trim());
      if ('refused' in r) {
        const reason = `proxy authentication failed (${r.refused}): use the proxy URL of the run's environment`;
        this.o.onDecision?.({ host, port, allowed: false, reason });
        return answer(client, 407, reason);
      }
      allowedHosts = r.allowedHosts;
      who = { executionId: r.executionId };
    }
    const decided = await this.decide(host, port, allowedHosts);
    this.o.onDecision?.({ ...who, host, port, allowed: decided.address !== null, ...(decided.reason ? { reason: decided.reason } : {}) });
    if (decided.address === null) return answer(client, 403, decided.reason ?? 'not allowed');
    if (client.destroyed) return;
    const upstream = net.connect({ host: decided.address, port });
    this.track(upstream);
    upstream.setTimeout(this.o.connectTimeoutMs ?? 10_000, () => {
      answer(client, 504, `connecting to ${host}:${port} timed out`);
      upstream.destroy();
    });
    upstream.once('error', (err) => answer(client, 502, `cannot connect to ${host}:${port}: ${(err as NodeJS.ErrnoException).code ?? err.message}`));
    upstream.once('connect', () => {
      upstream.setTimeout(0);
      upstream.removeAllListeners('error');
      upstream.on('error', () => client.destroy());
      client.on('error', () => upstream.destroy());
      if (forward) upstream.write(forward);
      else {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        if (rest.length > 0) upstream.write(rest);
      }
      client.pipe(upstream);
      upstream.pipe(client);
      client.resume();
    });
  }

  /** The address to connect to, or null and why not. */
  private async decide(host: string, port: number, allowedHosts: string[]): Promise<{ address: string | null; reason?: string }> {
    if (!hostMatches(host, port, allowedHosts)) {
      return { address: null, reason: `egress to ${host}:${port} is not allowed by this job type (allowed_hosts: ${allowedHosts.join(', ')})` };
    }
    if (net.isIP(host) !== 0) return { address: host };
    let addrs: { address: string }[];
    try {
      addrs = await this.lookup(host);
    } catch (err) {
      return { address: null, reason: `cannot resolve ${host}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}` };
    }
    if (addrs.length === 0) return { address: null, reason: `cannot resolve ${host}` };
    const inner = addrs.find((a) => !isPublicAddress(a.address));
    if (inner) return { address: null, reason: `${host} resolves to ${inner.address}, which is not a public address` };
    return { address: addrs[0]!.address };
  }
}

function answer(s: net.Socket, status: number, message: string): void {
  if (s.destroyed) return;
  const text = { 400: 'Bad Request', 403: 'Forbidden', 407: 'Proxy Authentication Required', 431: 'Request Header Fields Too Large', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' }[status] ?? 'Error';
  const body = `sandpod egress proxy: ${message}\n`;
  const challenge = status === 407 ? 'Proxy-Authenticate: Basic realm="sandpod-egress"\r\n' : '';
  s.end(`HTTP/1.1 ${status} ${text}\r\n${challenge}Content-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  // Discard whatever the program still sends: unread bytes would keep the socket from seeing the
  // program's end, so it would never close and would hold its place under maxConnections.
  s.resume();
}
