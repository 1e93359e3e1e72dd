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
 * (`GET http://host/…`). Both go through the same steps:
 * - The target is parsed by target.ts: a host that is not a well-formed LDH name or canonical IP
 *   literal, or a bad port, is `400` before any pattern match or lookup.
 * - It goes out only when its host and port match a pattern (jobtypes/host-patterns.ts); a name only
 *   a name pattern, an IP literal only an IP pattern.
 * - A name is resolved once, and refused when any of its addresses is not public (addresses.ts): a
 *   pattern cannot be turned against the host or its network by DNS. The connection goes to the
 *   address that was checked (dialled as an address: no second lookup).
 * - An address written literally in the list is allowed whatever its kind: the operator named it.
 * Refusals are `403` with a one-line reason, which the program sees as an HTTP or tunnel error.
 *
 * Limits (admission.ts): a connection must send its whole request head within the head deadline
 * (`408` after it); connections still sending a head are capped per source address and in total;
 * connections past the head are capped per run and in total (`503` past a cap); a tunnel or forwarded
 * request with no byte either way for the idle timeout is closed.
 */
import { promises as dns } from 'node:dns';
import { chmodSync } from 'node:fs';
import net from 'node:net';
import { hostMatches } from '../jobtypes/host-patterns.ts';
import { isPublicAddress } from './addresses.ts';
import { Admission, type AdmissionStats } from './admission.ts';
import { hostHeader, parseAbsoluteTarget, parseConnectTarget, type ParsedTarget } from './target.ts';

export { isPublicAddress } from './addresses.ts';
export type { AdmissionStats } from './admission.ts';

/** Resolves a name to its addresses (dns.lookup with `all`). */
export type Lookup = (host: string) => Promise<{ address: string; family: number }[]>;

/** Opens the upstream connection to an address (never a name) that was checked. */
export type Dial = (address: string, port: number) => net.Socket;

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
  /** Opens upstream connections (default: `net.connect` to the address); tests record what is dialled. */
  dial?: Dial;
  /** Called once per request with what was decided (for logs and counts). */
  onDecision?: (d: EgressDecision) => void;
  connectTimeoutMs?: number;
  /** Time from accepting a connection to the end of its request head (default 10 s); then 408. */
  headTimeoutMs?: number;
  /** A tunnel or forwarded request with no byte either way for this long is closed (default 5 min). */
  idleTimeoutMs?: number;
  /** Most connections past their head at once (default 64); more are refused with 503. */
  maxConnections?: number;
  /** Most connections past their head of one run (default: maxConnections). */
  maxConnectionsPerRun?: number;
  /** Most connections still sending their head (default: maxConnections). */
  maxPendingConnections?: number;
  /** Most connections still sending their head from one source address (default: min(64, maxPendingConnections)). */
  maxPendingPerSource?: number;
}

const MAX_HEAD_BYTES = 16 * 1024;
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'te', 'trailer', 'upgrade']);
const defaultLookup: Lookup = (host) => dns.lookup(host, { all: true, verbatim: true });
const defaultDial: Dial = (address, port) => net.connect({ host: address, port, family: net.isIP(address) });
/** The run a local (single-run) proxy's connections are counted under. */
const LOCAL_RUN = 'local';

/** An egress proxy: one run's on a Unix socket, or the cluster's shared one on TCP. */
export class EgressProxy {
  private readonly sockets = new Set<net.Socket>();
  private readonly lookup: Lookup;
  private readonly dial: Dial;
  private readonly admission: Admission;
  private readonly headTimeoutMs: number;
  private readonly idleTimeoutMs: number;

  private constructor(
    private readonly server: net.Server,
    private readonly o: EgressProxyOptions,
  ) {
    this.lookup = o.lookup ?? defaultLookup;
    this.dial = o.dial ?? defaultDial;
    this.headTimeoutMs = o.headTimeoutMs ?? 10_000;
    this.idleTimeoutMs = o.idleTimeoutMs ?? 300_000;
    const maxConnections = o.maxConnections ?? 64;
    const maxPending = o.maxPendingConnections ?? maxConnections;
    this.admission = new Admission({
      maxConnections,
      maxConnectionsPerRun: o.maxConnectionsPerRun ?? maxConnections,
      maxPending,
      maxPendingPerSource: o.maxPendingPerSource ?? Math.min(64, maxPending),
    });
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

  /** Connections by phase and whether a cap is reached (the cluster proxy's readiness). */
  stats(): AdmissionStats {
    return this.admission.stats();
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
    // A Unix socket has no peer address: its one client is the run the proxy belongs to.
    const source = client.remoteAddress ?? LOCAL_RUN;
    if (!this.admission.openPending(source)) return this.answer(client, 503, 'too many connections waiting to send a request head');
    let pending = true;
    const endPending = () => {
      if (!pending) return;
      pending = false;
      clearTimeout(deadline);
      this.admission.closePending(source);
    };
    const deadline = setTimeout(() => {
      client.off('data', onData);
      endPending();
      this.answer(client, 408, `request head not received within ${this.headTimeoutMs} ms`);
    }, this.headTimeoutMs);
    client.once('close', endPending);
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length > MAX_HEAD_BYTES) {
          client.off('data', onData);
          endPending();
          this.answer(client, 431, 'request head too large');
        }
        return;
      }
      client.off('data', onData);
      endPending();
      client.pause();
      // Nothing a sandboxed program sends may take the service down: any failure ends its connection.
      this.handle(client, head.subarray(0, end).toString('latin1'), head.subarray(end + 4)).catch(() => client.destroy());
    };
    client.on('data', onData);
  }

  private async handle(client: net.Socket, head: string, rest: Buffer): Promise<void> {
    const lines = head.split('\r\n');
    const m = /^([A-Z]+) (\S+) HTTP\/1\.[01]$/.exec(lines[0] ?? '');
    if (!m) return this.answer(client, 400, 'not an HTTP/1.x proxy request');
    const [, method, raw] = m as unknown as [string, string, string];
    const target = method === 'CONNECT' ? parseConnectTarget(raw) : parseAbsoluteTarget(raw);
    if ('malformed' in target) return this.answer(client, 400, target.malformed);
    const { host, port } = { host: target.host.host, port: target.port };
    const forward = method === 'CONNECT' ? null : Buffer.concat([Buffer.from(forwardedHead(method, target, lines), 'latin1'), rest]);
    let allowedHosts = this.o.allowedHosts ?? [];
    let who: { executionId?: string } = {};
    if (this.o.authenticate) {
      const auth = lines.slice(1).find((l) => headerName(l) === 'proxy-authorization');
      const r = this.o.authenticate(auth === undefined ? undefined : auth.slice(auth.indexOf(':') + 1).trim());
      if ('refused' in r) {
        const reason = `proxy authentication failed (${r.refused}): use the proxy URL of the run's environment`;
        this.o.onDecision?.({ host, port, allowed: false, reason });
        return this.answer(client, 407, reason);
      }
      allowedHosts = r.allowedHosts;
      who = { executionId: r.executionId };
    }
    // Counted from here: the head was valid (and, shared, carried a valid credential).
    if (client.destroyed) return;
    const run = who.executionId ?? LOCAL_RUN;
    const admitted = this.admission.admit(run);
    if ('refused' in admitted) {
      this.o.onDecision?.({ ...who, host, port, allowed: false, reason: admitted.refused });
      return this.answer(client, 503, admitted.refused);
    }
    client.once('close', () => this.admission.release(run));
    const decided = await this.decide(target, allowedHosts);
    this.o.onDecision?.({ ...who, host, port, allowed: decided.address !== null, ...(decided.reason ? { reason: decided.reason } : {}) });
    if (decided.address === null) return this.answer(client, 403, decided.reason ?? 'not allowed');
    if (client.destroyed) return;
    const upstream = this.dial(decided.address, port);
    this.track(upstream);
    client.once('close', () => upstream.destroy());
    upstream.setTimeout(this.o.connectTimeoutMs ?? 10_000, () => {
      this.answer(client, 504, `connecting to ${host}:${port} timed out`);
      upstream.destroy();
    });
    upstream.once('error', (err) => this.answer(client, 502, `cannot connect to ${host}:${port}: ${(err as NodeJS.ErrnoException).code ?? err.message}`));
    upstream.once('connect', () => {
      upstream.setTimeout(0);
      upstream.removeAllListeners('error');
      upstream.on('error', () => client.destroy());
      client.on('error', () => upstream.destroy());
      // Reads and writes both count as activity, so the client's socket sees traffic either way.
      client.setTimeout(this.idleTimeoutMs, () => {
        client.destroy();
        upstream.destroy();
      });
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
  private async decide(target: ParsedTarget, allowedHosts: string[]): Promise<{ address: string | null; reason?: string }> {
    const { host: { host, kind }, port } = target;
    if (!hostMatches(host, port, allowedHosts)) {
      return { address: null, reason: `egress to ${host}:${port} is not allowed by this job type (allowed_hosts: ${allowedHosts.join(', ')})` };
    }
    // A literal matched a literal entry: the operator named this address.
    if (kind !== 'name') return { address: host };
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

  /**
   * Answers with `status` and ends the connection. Whatever the program still sends is discarded
   * (unread bytes would keep its end from being seen); one that never hangs up is cut after a short
   * linger, so a refused connection holds no descriptor for long.
   */
  private answer(s: net.Socket, status: number, message: string): void {
    if (s.destroyed) return;
    const text =
      { 400: 'Bad Request', 403: 'Forbidden', 407: 'Proxy Authentication Required', 408: 'Request Timeout', 431: 'Request Header Fields Too Large', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' }[status] ?? 'Error';
    const body = `sandpod egress proxy: ${message}\n`;
    const challenge = status === 407 ? 'Proxy-Authenticate: Basic realm="sandpod-egress"\r\n' : '';
    s.end(`HTTP/1.1 ${status} ${text}\r\n${challenge}Content-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    s.resume();
    const linger = setTimeout(() => s.destroy(), Math.min(this.headTimeoutMs, 2000));
    s.once('close', () => clearTimeout(linger));
  }
}

function headerName(line: string): string {
  return line.slice(0, line.indexOf(':')).trim().toLowerCase();
}

/** The head sent upstream for an absolute-form request: origin form, the target's Host, no hop-by-hop headers. */
function forwardedHead(method: string, target: ParsedTarget, lines: string[]): string {
  // Hop-by-hop: the fixed list and whatever the Connection header names.
  const named = lines.filter((l) => headerName(l) === 'connection').flatMap((l) => l.slice(l.indexOf(':') + 1).split(',').map((t) => t.trim().toLowerCase()));
  // Host is the target's: another name in it could reach a different site on a shared address.
  const headers = lines.slice(1).filter((l) => !HOP_BY_HOP.has(headerName(l)) && !named.includes(headerName(l)) && headerName(l) !== 'host');
  return `${method} ${target.path ?? '/'} HTTP/1.1\r\n${[`Host: ${hostHeader(target)}`, ...headers, 'Connection: close'].join('\r\n')}\r\n\r\n`;
}
