import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { hostMatches, isHostPattern } from '../../../../../src/jobtypes/host-patterns.ts';
import { EgressProxy, isPublicAddress, type EgressDecision, type EgressProxyOptions, type Lookup } from '../../../../../src/runtime/local/runs/egress-proxy.ts';

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

let dir: string;
let sockCounter = 0;
const cleanups: Array<() => unknown> = [];

beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'sandpod-egress-'));
});

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

function freshSocketPath(): string {
  sockCounter += 1;
  return path.join(dir, `proxy-${sockCounter}.sock`);
}

/** Starts a proxy on a fresh socket path; it is closed after the test. */
async function startProxy(o: EgressProxyOptions): Promise<{ proxy: EgressProxy; sockPath: string }> {
  const sockPath = freshSocketPath();
  const proxy = await EgressProxy.listen(sockPath, o);
  cleanups.push(() => proxy.close());
  return { proxy, sockPath };
}

/** Collects every decision the proxy reports. */
function decisionLog(): { decisions: EgressDecision[]; onDecision: (d: EgressDecision) => void } {
  const decisions: EgressDecision[] = [];
  return { decisions, onDecision: (d) => decisions.push(d) };
}

interface RawResponse {
  raw: Buffer;
  status: number;
  head: string;
  body: string;
}

function parseResponse(raw: Buffer): RawResponse {
  const text = raw.toString('latin1');
  const m = /^HTTP\/1\.[01] (\d{3})[^\r\n]*\r\n/.exec(text);
  const split = text.indexOf('\r\n\r\n');
  return {
    raw,
    status: m ? Number(m[1]) : NaN,
    head: split >= 0 ? text.slice(0, split) : text,
    body: split >= 0 ? raw.subarray(split + 4).toString('utf8') : '',
  };
}

/**
 * Connects to the Unix socket, writes each chunk in turn (with a short pause between chunks so they
 * arrive as separate reads), and collects everything until the proxy closes the connection.
 */
function exchange(sockPath: string, ...chunks: Array<string | Buffer>): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const received: Buffer[] = [];
    const s = net.connect(sockPath);
    s.on('data', (d: Buffer) => received.push(d));
    // A reset after the proxy has answered (e.g. 431 while we still write) is not a test failure.
    s.on('error', (err) => (received.length > 0 ? undefined : reject(err)));
    s.on('close', () => resolve(parseResponse(Buffer.concat(received))));
    s.once('connect', async () => {
      for (const [i, c] of chunks.entries()) {
        if (i > 0) await new Promise((r) => setTimeout(r, 30));
        if (!s.destroyed) s.write(c);
      }
    });
  });
}

/** Reads from `s` until the accumulated bytes satisfy `done`; resolves with all of them. */
function readUntil(s: net.Socket, done: (all: Buffer) => boolean, timeoutMs = 5000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    let all = Buffer.alloc(0);
    const timer = setTimeout(() => finish(new Error(`timed out; got ${JSON.stringify(all.toString('latin1'))}`)), timeoutMs);
    const onData = (d: Buffer) => {
      all = Buffer.concat([all, d]);
      if (done(all)) finish();
    };
    const onClose = () => finish(new Error(`socket closed; got ${JSON.stringify(all.toString('latin1'))}`));
    function finish(err?: Error): void {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('close', onClose);
      if (err) reject(err);
      else resolve(all);
    }
    s.on('data', onData);
    s.on('close', onClose);
  });
}

function connectUnix(sockPath: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(sockPath);
    s.once('connect', () => resolve(s));
    s.once('error', reject);
    cleanups.push(() => s.destroy());
  });
}

interface SeenRequest {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
  rawHeaders: string[];
}

/** An HTTP server on 127.0.0.1 that records each request and answers with a recognizable body. */
async function startHttpUpstream(): Promise<{ port: number; seen: SeenRequest[] }> {
  const seen: SeenRequest[] = [];
  const server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      const body = Buffer.concat(parts).toString('utf8');
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, rawHeaders: req.rawHeaders, body });
      const answer = `upstream says hi: ${req.method} ${body.length}`;
      res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(answer), 'X-Upstream': 'yes' });
      res.end(answer);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  cleanups.push(() => {
    server.closeAllConnections();
    return new Promise<void>((r) => server.close(() => r()));
  });
  return { port: (server.address() as net.AddressInfo).port, seen };
}

/** A TCP echo server on 127.0.0.1 that counts connections and records what it received. */
async function startEchoUpstream(): Promise<{ port: number; connections: () => number; received: () => string }> {
  let connections = 0;
  let received = '';
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    connections += 1;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    s.on('data', (d: Buffer) => {
      received += d.toString('latin1');
      s.write(d);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  cleanups.push(() => {
    for (const s of sockets) s.destroy();
    return new Promise<void>((r) => server.close(() => r()));
  });
  return { port: (server.address() as net.AddressInfo).port, connections: () => connections, received: () => received };
}

const ESTABLISHED = 'HTTP/1.1 200 Connection Established\r\n\r\n';

// ---------------------------------------------------------------------------------------------
// Pure functions
// ---------------------------------------------------------------------------------------------

// hostMatches / isHostPattern live in jobtypes/host-patterns.ts; the proxy decides with them.
describe('hostMatches', () => {
  it('matches an exact name only', () => {
    expect(hostMatches('example.com', 443, ['example.com'])).toBe(true);
    expect(hostMatches('a.example.com', 443, ['example.com'])).toBe(false);
    expect(hostMatches('example.org', 443, ['example.com'])).toBe(false);
    expect(hostMatches('example.com', 443, [])).toBe(false);
  });

  it('matches names below a *. wildcard, not the name itself nor a lookalike', () => {
    const p = ['*.example.com'];
    expect(hostMatches('a.example.com', 443, p)).toBe(true);
    expect(hostMatches('a.b.example.com', 443, p)).toBe(true);
    expect(hostMatches('example.com', 443, p)).toBe(false);
    expect(hostMatches('badexample.com', 443, p)).toBe(false);
    expect(hostMatches('.example.com', 443, p)).toBe(false);
    expect(hostMatches('example.com.evil.net', 443, p)).toBe(false);
  });

  it('lets * match any name', () => {
    expect(hostMatches('anything.at.all', 443, ['*'])).toBe(true);
    expect(hostMatches('localhost', 80, ['*'])).toBe(true);
  });

  it('ignores case and a trailing dot on either side', () => {
    expect(hostMatches('API.Example.COM.', 443, ['api.example.com'])).toBe(true);
    expect(hostMatches('api.example.com', 443, ['API.EXAMPLE.COM.'])).toBe(true);
    expect(hostMatches('a.example.com', 443, ['*.EXAMPLE.com.'])).toBe(true);
  });

  it('matches an IP literal host only against a literal pattern of the same address', () => {
    expect(hostMatches('127.0.0.1', 80, ['127.0.0.1'])).toBe(true);
    expect(hostMatches('127.0.0.2', 80, ['127.0.0.1'])).toBe(false);
    expect(hostMatches('::1', 80, ['0:0:0:0:0:0:0:1'])).toBe(true);
    expect(hostMatches('0:0:0:0:0:0:0:1', 80, ['::1'])).toBe(true);
    expect(hostMatches('[::1]', 80, ['::1'])).toBe(true);
    expect(hostMatches('::1', 80, ['[::1]'])).toBe(true);
    expect(hostMatches('::2', 80, ['::1'])).toBe(false);
  });

  it('never matches an IP literal host with a name pattern', () => {
    expect(hostMatches('127.0.0.1', 80, ['*'])).toBe(false);
    expect(hostMatches('10.0.0.1', 80, ['*.0.0.1'])).toBe(false);
    expect(hostMatches('::1', 80, ['*', 'localhost'])).toBe(false);
  });

  it('limits a pattern with :port to that port', () => {
    expect(hostMatches('api.github.com', 443, ['api.github.com:443'])).toBe(true);
    expect(hostMatches('api.github.com', 80, ['api.github.com:443'])).toBe(false);
    expect(hostMatches('a.example.com', 8443, ['*.example.com:8443'])).toBe(true);
    expect(hostMatches('::1', 8080, ['[::1]:8080'])).toBe(true);
    expect(hostMatches('::1', 8081, ['[::1]:8080'])).toBe(false);
  });
});

describe('isHostPattern', () => {
  it.each([
    'example.com',
    'API.Example.com.',
    'localhost',
    'a-b.c-d.io',
    '*.example.com',
    '*',
    '127.0.0.1',
    '::1',
    '2606:4700::1111',
    '[::1]',
    'api.github.com:443',
    '[::1]:8080',
  ])('accepts %j', (p) => expect(isHostPattern(p)).toBe(true));

  it.each(['*.', '*..', '*.:443', 'x.com..', 'http://x', 'a b', '*x.com', 'x.*', 'a.*.com', '', '..', '.', 'a..b', '-a.com', 'a-.com', 'x.com/path', 'x.com:0', 'x.com:70000', `${'a'.repeat(64)}.com`, 'a-b.c_d.io', '1.2.3', '*.0x7f', 'a\0.com', '%30.com', 'fe80::1%eth0'])(
    'rejects %j',
    (p) => expect(isHostPattern(p)).toBe(false),
  );
});

describe('isPublicAddress', () => {
  it.each([
    '127.0.0.1',
    '10.1.2.3',
    '172.16.0.1',
    '172.31.255.255',
    '192.168.1.1',
    '169.254.169.254',
    '100.64.0.1',
    '0.0.0.0',
    '224.0.0.1',
    '255.255.255.255',
    '::',
    '::1',
    'fe80::1',
    'fc00::1',
    'fd12:3456::1',
    'ff02::1',
    '::ffff:127.0.0.1',
    '::ffff:7f00:1',
    '::ffff:10.0.0.1',
    // The special-purpose ranges besides the private ones: IETF protocol assignments, the three
    // documentation nets, benchmarking, reserved; IPv6 documentation, NAT64, discard-only.
    '192.0.0.9',
    '192.0.2.1',
    '198.18.0.1',
    '198.19.255.255',
    '198.51.100.7',
    '203.0.113.7',
    '240.0.0.1',
    '2001:db8::1',
    '64:ff9b::a00:1',
    '100::1',
  ])('%s is not public', (ip) => expect(isPublicAddress(ip)).toBe(false));

  it.each(['8.8.8.8', '1.1.1.1', '172.32.0.1', '100.128.0.1', '192.0.1.1', '198.20.0.1', '203.0.114.1', '2606:4700::1111', '2001:db9::1', '::ffff:8.8.8.8'])('%s is public', (ip) =>
    expect(isPublicAddress(ip)).toBe(true),
  );

  it.each(['', 'example.com', '999.1.1.1', '1.2.3', 'not an ip', '[::1]'])('garbage %j is not public', (s) => expect(isPublicAddress(s)).toBe(false));
});

// ---------------------------------------------------------------------------------------------
// The proxy over a real Unix socket
// ---------------------------------------------------------------------------------------------

describe('EgressProxy: plain HTTP', () => {
  it('forwards an absolute-form GET in origin form, dropping hop-by-hop headers', async () => {
    const up = await startHttpUpstream();
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], onDecision: log.onDecision });

    const res = await exchange(
      sockPath,
      `GET http://127.0.0.1:${up.port}/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:${up.port}\r\nProxy-Connection: keep-alive\r\nConnection: x-hop\r\nX-Hop: 1\r\nX-Test: 1\r\n\r\n`,
    );

    expect(res.status).toBe(200);
    expect(res.head).toMatch(/^x-upstream: yes$/im);
    expect(res.body).toBe('upstream says hi: GET 0');
    expect(up.seen).toHaveLength(1);
    const seen = up.seen[0]!;
    expect(seen.method).toBe('GET');
    expect(seen.url).toBe('/x?y=1');
    expect(seen.headers.connection).toBe('close');
    expect(seen.headers).not.toHaveProperty('proxy-connection');
    expect(seen.headers).not.toHaveProperty('x-hop'); // named by Connection: hop-by-hop too
    expect(seen.headers['x-test']).toBe('1');
    expect(seen.headers.host).toBe(`127.0.0.1:${up.port}`);
    expect(log.decisions).toEqual([{ host: '127.0.0.1', port: up.port, allowed: true }]);
  });

  it('sends the URL\'s host as Host, whatever the program wrote there', async () => {
    const up = await startHttpUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const res = await exchange(sockPath, `GET http://127.0.0.1:${up.port}/ HTTP/1.1\r\nHost: evil.example.org\r\nhost: also.evil\r\n\r\n`);
    expect(res.status).toBe(200);
    expect(up.seen[0]!.headers.host).toBe(`127.0.0.1:${up.port}`);
    expect(up.seen[0]!.rawHeaders.filter((h, i) => i % 2 === 0 && h.toLowerCase() === 'host')).toHaveLength(1);
  });

  it('forwards a POST body intact, both the part sent with the head and the part sent later', async () => {
    const up = await startHttpUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const body = 'first-half:' + 'a'.repeat(3000) + '|second-half:' + 'b'.repeat(5000);
    const cut = 1000;

    const res = await exchange(
      sockPath,
      `POST http://127.0.0.1:${up.port}/submit HTTP/1.1\r\nHost: 127.0.0.1:${up.port}\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, cut)}`,
      body.slice(cut),
    );

    expect(res.status).toBe(200);
    expect(res.body).toBe(`upstream says hi: POST ${body.length}`);
    expect(up.seen).toHaveLength(1);
    expect(up.seen[0]!.method).toBe('POST');
    expect(up.seen[0]!.url).toBe('/submit');
    expect(up.seen[0]!.body).toBe(body);
  });
});

describe('EgressProxy: CONNECT', () => {
  it('establishes a tunnel and relays bytes both ways', async () => {
    const echo = await startEchoUpstream();
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], onDecision: log.onDecision });
    const s = await connectUnix(sockPath);

    s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nHost: x\r\n\r\n`);
    const head = await readUntil(s, (b) => b.length >= ESTABLISHED.length);
    expect(head.toString('latin1')).toBe(ESTABLISHED);

    s.write('ping 1\n');
    expect((await readUntil(s, (b) => b.includes('ping 1\n'))).toString()).toBe('ping 1\n');
    s.write(Buffer.from([0, 1, 2, 255, 254]));
    expect([...(await readUntil(s, (b) => b.length >= 5))]).toEqual([0, 1, 2, 255, 254]);

    expect(echo.connections()).toBe(1);
    expect(log.decisions).toEqual([{ host: '127.0.0.1', port: echo.port, allowed: true }]);
  });

  it('delivers bytes sent in the same write right after the CONNECT head', async () => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const s = await connectUnix(sockPath);

    s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nHost: x\r\n\r\nEARLY-BYTES`);
    const all = await readUntil(s, (b) => b.length >= ESTABLISHED.length + 'EARLY-BYTES'.length);

    expect(all.toString('latin1')).toBe(ESTABLISHED + 'EARLY-BYTES');
    expect(echo.received()).toBe('EARLY-BYTES');
  });
});

describe('EgressProxy: refusals', () => {
  it('refuses a host not in the list with 403 naming the host, without connecting', async () => {
    const echo = await startEchoUpstream();
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['api.example.com'], onDecision: log.onDecision });

    const res = await exchange(sockPath, `CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nHost: x\r\n\r\n`);

    expect(res.status).toBe(403);
    expect(res.body).toContain('127.0.0.1');
    expect(res.body).toContain('not allowed');
    expect(echo.connections()).toBe(0);
    expect(log.decisions).toHaveLength(1);
    expect(log.decisions[0]).toMatchObject({ host: '127.0.0.1', port: echo.port, allowed: false });
    expect(log.decisions[0]!.reason).toContain('127.0.0.1');
  });

  it('refuses a port that a :port pattern does not allow', async () => {
    const echo = await startEchoUpstream();
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: [`127.0.0.1:${echo.port}`], onDecision: log.onDecision });
    const otherPort = echo.port === 65535 ? 65534 : echo.port + 1;

    const refused = await exchange(sockPath, `CONNECT 127.0.0.1:${otherPort} HTTP/1.1\r\n\r\n`);
    expect(refused.status).toBe(403);
    expect(refused.body).toContain(`127.0.0.1:${otherPort}`);

    const s = await connectUnix(sockPath);
    s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\n\r\n`);
    expect((await readUntil(s, (b) => b.length >= ESTABLISHED.length)).toString('latin1')).toBe(ESTABLISHED);
    expect(log.decisions.map((d) => [d.port, d.allowed])).toEqual([
      [otherPort, false],
      [echo.port, true],
    ]);
  });

  it('refuses a plain-HTTP request to a host not in the list with 403', async () => {
    const up = await startHttpUpstream();
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['*.example.com'], onDecision: log.onDecision });

    const res = await exchange(sockPath, `GET http://other.test:${up.port}/ HTTP/1.1\r\nHost: other.test\r\n\r\n`);

    expect(res.status).toBe(403);
    expect(res.body).toContain('other.test');
    expect(up.seen).toHaveLength(0);
    expect(log.decisions).toEqual([expect.objectContaining({ host: 'other.test', port: up.port, allowed: false })]);
  });

  it('refuses a matching name that resolves to a non-public address (the real resolver: localhost)', async () => {
    const echo = await startEchoUpstream();
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['localhost'], onDecision: log.onDecision });

    const res = await exchange(sockPath, `CONNECT localhost:${echo.port} HTTP/1.1\r\nHost: localhost\r\n\r\n`);

    expect(res.status).toBe(403);
    expect(res.body).toMatch(/localhost resolves to (127\.0\.0\.1|::1)/);
    expect(res.body).toContain('not a public address');
    expect(echo.connections()).toBe(0);
    expect(log.decisions).toEqual([expect.objectContaining({ host: 'localhost', port: echo.port, allowed: false })]);
  });

  it('refuses a name when any one of its addresses is not public', async () => {
    const echo = await startEchoUpstream();
    const lookup: Lookup = async () => [
      { address: '8.8.8.8', family: 4 },
      { address: '::ffff:127.0.0.1', family: 6 },
    ];
    const { sockPath } = await startProxy({ allowedHosts: ['*.example.com'], lookup });

    const res = await exchange(sockPath, `CONNECT api.example.com:${echo.port} HTTP/1.1\r\n\r\n`);

    expect(res.status).toBe(403);
    expect(res.body).toContain('::ffff:127.0.0.1');
    expect(echo.connections()).toBe(0);
  });

  it('allows a name resolving to a public address and tries to connect to that address', async () => {
    // What the connection does depends on the machine's network (here: public IPv6 has no route, so
    // EHOSTUNREACH → 502 or a time-out → 504; IPv4 would meet a transparent proxy). Only the refusal
    // (403) would be wrong.
    const log = decisionLog();
    const lookup: Lookup = async () => [{ address: '2606:4700::1111', family: 6 }];
    const { sockPath } = await startProxy({ allowedHosts: ['*.example.com'], lookup, onDecision: log.onDecision, connectTimeoutMs: 2000 });

    const res = await exchange(sockPath, `CONNECT api.example.com:9 HTTP/1.1\r\nHost: api.example.com\r\n\r\n`);

    expect(res.status).not.toBe(403);
    if (res.status === 502 || res.status === 504) expect(res.body).toContain('api.example.com:9');
    expect(log.decisions).toEqual([{ host: 'api.example.com', port: 9, allowed: true }]);
  });

  // DNS rebinding: the name's owner answers the proxy's check with a public address and a second
  // lookup with an inner one. The fake resolver stands for the first answer; the system resolver (which
  // says 127.0.0.1 for localhost) for the second. Only the checked address may be dialled.
  it.each([
    ['CONNECT', (port: number) => `CONNECT localhost:${port} HTTP/1.1\r\nHost: localhost\r\n\r\n`],
    ['plain HTTP', (port: number) => `GET http://localhost:${port}/ HTTP/1.1\r\nHost: localhost\r\n\r\n`],
  ])('%s: connects to the address it checked, never to the name again (DNS rebinding)', async (_kind, request) => {
    const echo = await startEchoUpstream();
    let lookups = 0;
    // Public IPv6 has no route here: dialling it fails fast (502) or times out (504).
    const lookup: Lookup = async () => {
      lookups += 1;
      return [{ address: '2606:4700::1111', family: 6 }];
    };
    const { sockPath } = await startProxy({ allowedHosts: ['localhost'], lookup, connectTimeoutMs: 1000 });

    const res = await exchange(sockPath, request(echo.port));

    expect([502, 504]).toContain(res.status);
    expect(res.body).toContain(`localhost:${echo.port}`);
    expect(lookups).toBe(1);
    expect(echo.connections()).toBe(0);
  }, 10_000); // a tunnel to the echo server (the flaw) stays open: fail in seconds, not at the suite's minute

  it('refuses with 403 "cannot resolve" when the name does not resolve (the real resolver: .invalid)', async () => {
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['*.invalid'], onDecision: log.onDecision });

    const res = await exchange(sockPath, `GET http://api.sandpod.invalid/ HTTP/1.1\r\nHost: api.sandpod.invalid\r\n\r\n`);

    expect(res.status).toBe(403);
    expect(res.body).toContain('cannot resolve api.sandpod.invalid');
    expect(log.decisions).toEqual([expect.objectContaining({ host: 'api.sandpod.invalid', port: 80, allowed: false })]);
  });

  it.each([
    ['an origin-form request line', 'GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'],
    ['an https:// absolute URL', 'GET https://x/ HTTP/1.1\r\nHost: x\r\n\r\n'],
    ['a garbage request line', 'hello there\r\n\r\n'],
    ['an HTTP/2 request line', 'GET http://127.0.0.1/ HTTP/2.0\r\n\r\n'],
    ['a CONNECT without a port', 'CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n'],
    ['a CONNECT with a port out of range', 'CONNECT 127.0.0.1:70000 HTTP/1.1\r\n\r\n'],
  ])('answers 400 to %s', async (_name, request) => {
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['*', '127.0.0.1'], onDecision: log.onDecision });

    const res = await exchange(sockPath, request);

    expect(res.status).toBe(400);
    expect(res.body).toMatch(/^sandpod egress proxy: .+\n$/);
    expect(log.decisions).toEqual([]);
  });

  it('answers 431 to a head over 16 KiB that never ends', async () => {
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], onDecision: log.onDecision });

    const res = await exchange(sockPath, `GET http://127.0.0.1/ HTTP/1.1\r\nX-Pad: ${'p'.repeat(17 * 1024)}\r\n`);

    expect(res.status).toBe(431);
    expect(res.body).toContain('too large');
    expect(log.decisions).toEqual([]);
  });

  it('answers 503 once more connections than maxConnections are open', async () => {
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], maxConnections: 1 });
    const idle = await connectUnix(sockPath);
    // Make sure the proxy has accepted the first connection before opening the second.
    await new Promise((r) => setTimeout(r, 50));

    const res = await exchange(sockPath, 'GET http://127.0.0.1/ HTTP/1.1\r\n\r\n');

    expect(res.status).toBe(503);
    expect(idle.destroyed).toBe(false);
  });
});

describe('EgressProxy: connection limit', () => {
  it('counts clients only: with maxConnections 2, a second tunnel opens beside the first', async () => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], maxConnections: 2 });
    const tunnels: net.Socket[] = [];
    for (const n of [1, 2]) {
      const s = await connectUnix(sockPath);
      s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\n\r\n`);
      expect((await readUntil(s, (b) => b.length >= ESTABLISHED.length)).toString('latin1')).toBe(ESTABLISHED);
      s.write(`ping ${n}\n`);
      expect((await readUntil(s, (b) => b.includes('\n'))).toString()).toBe(`ping ${n}\n`);
      tunnels.push(s);
    }
    expect(echo.connections()).toBe(2);
    const third = await exchange(sockPath, `CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\n\r\n`);
    expect(third.status).toBe(503);
    for (const t of tunnels) t.destroy();
  });
});

describe('EgressProxy: lifecycle', () => {
  it('close() ends an open tunnel and stops accepting connections', async () => {
    const echo = await startEchoUpstream();
    const { proxy, sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const s = await connectUnix(sockPath);
    s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\n\r\n`);
    await readUntil(s, (b) => b.length >= ESTABLISHED.length);
    const closed = new Promise<void>((r) => s.once('close', () => r()));

    await proxy.close();
    await closed;

    expect(s.destroyed).toBe(true);
    const err = await new Promise<NodeJS.ErrnoException | null>((resolve) => {
      const c = net.connect(sockPath);
      c.once('connect', () => {
        c.destroy();
        resolve(null);
      });
      c.once('error', (e) => resolve(e));
    });
    expect(err).not.toBeNull();
    expect(['ENOENT', 'ECONNREFUSED']).toContain(err!.code);
  });

  it('creates the socket file with mode 0666', async () => {
    const { sockPath } = await startProxy({ allowedHosts: [] });
    const st = statSync(sockPath);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o666);
  });
});

// ---------------------------------------------------------------------------------------------
// What the program sees, byte for byte, and the edges of what the proxy takes (issue #9 point 7:
// the mutation run showed these were unchecked).
// ---------------------------------------------------------------------------------------------

/** The whole answer a refusal sends: the program's HTTP client or tunnel shows exactly this. */
function refusal(status: number, reason: string, message: string): string {
  const body = `sandpod egress proxy: ${message}\n`;
  return `HTTP/1.1 ${status} ${reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

/** A TCP port on 127.0.0.1 that nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const { port } = s.address() as net.AddressInfo;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Sends `request` and retries while the answer is 503, up to `ms` (the proxy sees a close a moment after the client). */
async function untilNot503(sockPath: string, request: string, ms = 3000): Promise<RawResponse> {
  const end = Date.now() + ms;
  for (;;) {
    const res = await exchange(sockPath, request);
    if (res.status !== 503 || Date.now() > end) return res;
    // The refused attempt itself counts until the proxy has seen it close (some tens of ms).
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Reads everything `s` receives until it closes. */
function readToClose(s: net.Socket): Promise<Buffer> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    s.on('data', (d: Buffer) => parts.push(d));
    s.on('error', () => {});
    s.once('close', () => resolve(Buffer.concat(parts)));
  });
}

describe('EgressProxy: the exact refusal answers', () => {
  const lookupError = (code: string | undefined, message: string): Lookup => async () => {
    throw Object.assign(new Error(message), code ? { code } : {});
  };
  it.each<[string, Partial<EgressProxyOptions>, string, number, string, string]>([
    ['a garbage request line', {}, 'hello there\r\n\r\n', 400, 'Bad Request', 'not an HTTP/1.x proxy request'],
    ['a CONNECT without a port', {}, 'CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n', 400, 'Bad Request', 'CONNECT needs host:port, got 127.0.0.1'],
    ['an origin-form request', {}, 'GET /x HTTP/1.1\r\n\r\n', 400, 'Bad Request', 'a proxied request needs an absolute http:// URL (use CONNECT for https)'],
    ['an https:// URL', {}, 'GET https://a.example.com/ HTTP/1.1\r\n\r\n', 400, 'Bad Request', 'unsupported scheme https: (use CONNECT for https)'],
    ['CONNECT to port 0', {}, 'CONNECT 127.0.0.1:0 HTTP/1.1\r\n\r\n', 400, 'Bad Request', 'bad port 0'],
    ['CONNECT to port 65536', {}, 'CONNECT 127.0.0.1:65536 HTTP/1.1\r\n\r\n', 400, 'Bad Request', 'bad port 65536'],
    ['plain HTTP to port 0', {}, 'GET http://127.0.0.1:0/ HTTP/1.1\r\n\r\n', 400, 'Bad Request', 'bad port 0'],
    [
      'a host not in the list',
      { allowedHosts: ['api.example.com', '*.example.org'] },
      'CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n',
      403,
      'Forbidden',
      'egress to 127.0.0.1:443 is not allowed by this job type (allowed_hosts: api.example.com, *.example.org)',
    ],
    [
      'a name with one inner address',
      { lookup: async () => [{ address: '8.8.8.8', family: 4 }, { address: '10.0.0.7', family: 4 }] },
      'CONNECT api.example.com:443 HTTP/1.1\r\n\r\n',
      403,
      'Forbidden',
      'api.example.com resolves to 10.0.0.7, which is not a public address',
    ],
    ['a name the resolver fails with a code', { lookup: lookupError('ENOTFOUND', 'getaddrinfo ENOTFOUND') }, 'GET http://api.example.com/ HTTP/1.1\r\n\r\n', 403, 'Forbidden', 'cannot resolve api.example.com: ENOTFOUND'],
    ['a name the resolver fails without a code', { lookup: lookupError(undefined, 'resolver gave up') }, 'GET http://api.example.com/ HTTP/1.1\r\n\r\n', 403, 'Forbidden', 'cannot resolve api.example.com: resolver gave up'],
    ['a name with no addresses', { lookup: async () => [] }, 'CONNECT api.example.com:443 HTTP/1.1\r\n\r\n', 403, 'Forbidden', 'cannot resolve api.example.com'],
  ])('%s', async (_name, options, request, status, reason, message) => {
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['*.example.com', '127.0.0.1'], onDecision: log.onDecision, ...options });

    const res = await exchange(sockPath, request);

    expect(res.raw.toString('utf8')).toBe(refusal(status, reason, message));
    if (status === 403) expect(log.decisions).toEqual([expect.objectContaining({ allowed: false, reason: message })]);
    else expect(log.decisions).toEqual([]);
  });

  it('431 Request Header Fields Too Large', async () => {
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const res = await exchange(sockPath, `GET http://127.0.0.1/ HTTP/1.1\r\nX-Pad: ${'p'.repeat(17 * 1024)}\r\n`);
    expect(res.raw.toString('utf8')).toBe(refusal(431, 'Request Header Fields Too Large', 'request head too large'));
  });

  it('503 Service Unavailable: too many connections still sending a head', async () => {
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], maxConnections: 1 });
    await connectUnix(sockPath);
    await new Promise((r) => setTimeout(r, 50));
    const res = await exchange(sockPath, 'GET http://127.0.0.1/ HTTP/1.1\r\n\r\n');
    expect(res.raw.toString('utf8')).toBe(refusal(503, 'Service Unavailable', 'too many connections waiting to send a request head'));
  });

  it('503 Service Unavailable: too many connections past their head', async () => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], maxConnections: 1 });
    const s = await connectUnix(sockPath);
    s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\n\r\n`);
    await readUntil(s, (b) => b.length >= ESTABLISHED.length);
    const res = await exchange(sockPath, 'GET http://127.0.0.1/ HTTP/1.1\r\n\r\n');
    expect(res.raw.toString('utf8')).toBe(refusal(503, 'Service Unavailable', 'too many connections through the egress proxy'));
  });

  it('408 Request Timeout: a head not complete within the head deadline', async () => {
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], headTimeoutMs: 200 });
    const res = await exchange(sockPath, 'GET http://127.0.0.1/ HTTP/1.1\r\n');
    expect(res.raw.toString('utf8')).toBe(refusal(408, 'Request Timeout', 'request head not received within 200 ms'));
  });

  it.each([
    ['CONNECT', (port: number) => `CONNECT 127.0.0.1:${port} HTTP/1.1\r\n\r\n`],
    ['plain HTTP', (port: number) => `GET http://127.0.0.1:${port}/ HTTP/1.1\r\n\r\n`],
  ])('%s: 502 Bad Gateway naming the error when the connection is refused', async (_kind, request) => {
    const port = await closedPort();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const res = await exchange(sockPath, request(port));
    expect(res.raw.toString('utf8')).toBe(refusal(502, 'Bad Gateway', `cannot connect to 127.0.0.1:${port}: ECONNREFUSED`));
  });

  it('504 Gateway Timeout when the connection is not accepted in time', async () => {
    // A listener whose accept queue (backlog 0) is full: the next connection attempt hangs in SYN.
    const py = spawn('python3', ['-c', "import socket,sys\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen(0)\nprint(s.getsockname()[1],flush=True)\nsys.stdin.read()"], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    cleanups.push(() => py.kill());
    const port = await new Promise<number>((r) => py.stdout!.once('data', (d: Buffer) => r(Number(d.toString().trim()))));
    const filler = net.connect({ host: '127.0.0.1', port });
    cleanups.push(() => filler.destroy());
    await new Promise((r) => filler.once('connect', r));
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], connectTimeoutMs: 300 });

    const res = await exchange(sockPath, `CONNECT 127.0.0.1:${port} HTTP/1.1\r\n\r\n`);

    expect(res.raw.toString('utf8')).toBe(refusal(504, 'Gateway Timeout', `connecting to 127.0.0.1:${port} timed out`));
  });
});

describe('EgressProxy: request-line and target syntax', () => {
  it.each<[string, 'http' | 'connect', (port: number) => string, (port: number) => string]>([
    ['text before the method', 'http', (p) => `xGET http://127.0.0.1:${p}/ HTTP/1.1\r\n\r\n`, () => 'not an HTTP/1.x proxy request'],
    ['text after the version', 'http', (p) => `GET http://127.0.0.1:${p}/ HTTP/1.1 extra\r\n\r\n`, () => 'not an HTTP/1.x proxy request'],
    ['a version with a third digit', 'http', (p) => `GET http://127.0.0.1:${p}/ HTTP/1.10\r\n\r\n`, () => 'not an HTTP/1.x proxy request'],
    ['a CONNECT target with a path before it', 'connect', (p) => `CONNECT evil/127.0.0.1:${p} HTTP/1.1\r\n\r\n`, (p) => `CONNECT needs host:port, got evil/127.0.0.1:${p}`],
    ['a CONNECT port of six digits', 'connect', () => `CONNECT 127.0.0.1:100000 HTTP/1.1\r\n\r\n`, () => 'CONNECT needs host:port, got 127.0.0.1:100000'],
    ['a CONNECT port followed by text', 'connect', (p) => `CONNECT 127.0.0.1:${p}x HTTP/1.1\r\n\r\n`, (p) => `CONNECT needs host:port, got 127.0.0.1:${p}x`],
  ])('answers 400 to %s, and nothing reaches the upstream', async (_name, kind, request, message) => {
    const up = await startHttpUpstream();
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1', '*'] });
    const port = kind === 'http' ? up.port : echo.port;

    const res = await exchange(sockPath, request(port));

    expect(res.raw.toString('utf8')).toBe(refusal(400, 'Bad Request', message(port)));
    expect(up.seen).toHaveLength(0);
    expect(echo.connections()).toBe(0);
  });

  it('takes an HTTP/1.0 request and forwards it in origin form', async () => {
    const up = await startHttpUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const res = await exchange(sockPath, `GET http://127.0.0.1:${up.port}/ten HTTP/1.0\r\n\r\n`);
    expect(res.status).toBe(200);
    expect(up.seen.map((r) => r.url)).toEqual(['/ten']);
  });

  it('CONNECT to a bracketed IPv6 address listed as a literal', async () => {
    const sockets = new Set<net.Socket>();
    const server = net.createServer((s) => {
      sockets.add(s);
      s.on('data', (d: Buffer) => s.write(d));
      s.on('error', () => s.destroy());
    });
    await new Promise<void>((r) => server.listen(0, '::1', () => r()));
    cleanups.push(() => {
      for (const s of sockets) s.destroy();
      return new Promise<void>((r) => server.close(() => r()));
    });
    const { port } = server.address() as net.AddressInfo;
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['::1'], onDecision: log.onDecision });
    const s = await connectUnix(sockPath);

    s.write(`CONNECT [::1]:${port} HTTP/1.1\r\n\r\nv6`);

    expect((await readUntil(s, (b) => b.length >= ESTABLISHED.length + 2)).toString('latin1')).toBe(`${ESTABLISHED}v6`);
    expect(log.decisions).toEqual([{ host: '::1', port, allowed: true }]);
  });

  it.each([1, 65535])('CONNECT to port %i passes the port check', async (port) => {
    const log = decisionLog();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], onDecision: log.onDecision });
    const s = await connectUnix(sockPath);
    s.write(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\n\r\n`);
    // Whether something listens there (200) or not (502) depends on the machine; never a 400.
    const head = (await readUntil(s, (b) => b.includes('\r\n'))).toString('latin1');
    expect(head).toMatch(/^HTTP\/1\.1 (200 Connection Established|502 Bad Gateway)\r\n/);
    expect(log.decisions).toEqual([{ host: '127.0.0.1', port, allowed: true }]);
  });
});

describe('EgressProxy: the request head', () => {
  /** An HTTP upstream that takes heads up to 64 KiB (Node's default limit is the proxy's own, 16 KiB). */
  async function startRoomyUpstream(): Promise<{ port: number; seen: http.IncomingHttpHeaders[] }> {
    const seen: http.IncomingHttpHeaders[] = [];
    const server = http.createServer({ maxHeaderSize: 64 * 1024 }, (req, res) => {
      seen.push(req.headers);
      res.end('ok');
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    cleanups.push(() => {
      server.closeAllConnections();
      return new Promise<void>((r) => server.close(() => r()));
    });
    return { port: (server.address() as net.AddressInfo).port, seen };
  }

  it('is read across several writes', async () => {
    const up = await startHttpUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const res = await exchange(sockPath, `GET http://127.0.0.1:${up.port}/split HTTP/1.1\r\nX-Fi`, 'rst: 1\r\n', 'X-Second: 2\r\n\r\n');
    expect(res.status).toBe(200);
    expect(up.seen[0]).toMatchObject({ url: '/split', headers: expect.objectContaining({ 'x-first': '1', 'x-second': '2' }) });
  });

  it('is taken at exactly 16 KiB before its blank line, refused at one byte more', async () => {
    const up = await startRoomyUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const start = `GET http://127.0.0.1:${up.port}/ HTTP/1.1\r\nX-Pad: `;
    const exactly = start + 'p'.repeat(16 * 1024 - start.length);
    expect(Buffer.byteLength(exactly)).toBe(16 * 1024);

    const taken = await exchange(sockPath, exactly, '\r\n\r\n');
    expect(taken.status).toBe(200);
    expect(up.seen[0]!['x-pad']).toHaveLength(16 * 1024 - start.length);

    const refused = await exchange(sockPath, `${exactly}p`, '\r\n\r\n');
    expect(refused.raw.toString('utf8')).toBe(refusal(431, 'Request Header Fields Too Large', 'request head too large'));
    expect(up.seen).toHaveLength(1);
  });

  it('drops every hop-by-hop header, whatever its case, and each header the Connection header names', async () => {
    const up = await startHttpUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const hop = ['Connection: X-One , x-TWO', 'KEEP-ALIVE: timeout=5', 'Proxy-Connection: keep-alive', 'Proxy-Authorization: Basic c2VjcmV0', 'Proxy-Authenticate: Basic', 'TE: trailers', 'Trailer: X-Sum', 'Upgrade: websocket', 'X-One: 1', 'x-two: 2'];
    const res = await exchange(sockPath, `GET http://127.0.0.1:${up.port}/ HTTP/1.1\r\n${hop.join('\r\n')}\r\nX-Kept: yes\r\n\r\n`);
    expect(res.status).toBe(200);
    const names = up.seen[0]!.rawHeaders.filter((_h, i) => i % 2 === 0).map((h) => h.toLowerCase());
    expect(names.sort()).toEqual(['connection', 'host', 'x-kept']);
    expect(up.seen[0]!.headers.connection).toBe('close');
  });

  it('forwards the request line in origin form over HTTP/1.1, the head ending with Connection: close', async () => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const s = await connectUnix(sockPath);
    s.write(`DELETE http://127.0.0.1:${echo.port}/a/b?c=d&e HTTP/1.0\r\nX-A: 1\r\n\r\n`);
    const forwarded = await readUntil(s, (b) => b.includes('\r\n\r\n'));
    expect(forwarded.toString('latin1')).toBe(`DELETE /a/b?c=d&e HTTP/1.1\r\nHost: 127.0.0.1:${echo.port}\r\nX-A: 1\r\nConnection: close\r\n\r\n`);
  });
});

describe('EgressProxy: connections end cleanly', () => {
  it.each([
    ['a refused request', (_port: number) => 'GET http://not-listed.example/ HTTP/1.1\r\n\r\n'],
    ['a tunnel the program closes', (port: number) => `CONNECT 127.0.0.1:${port} HTTP/1.1\r\n\r\n`],
  ])('%s frees its place under maxConnections', async (_name, request) => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], maxConnections: 1 });
    for (let i = 0; i < 3; i++) {
      const s = await connectUnix(sockPath);
      s.write(request(echo.port));
      // The answer first (a refusal, or the tunnel established), then the program hangs up.
      const first = (await readUntil(s, (b) => b.includes('\r\n'))).toString('latin1');
      expect(first).toMatch(/^HTTP\/1\.1 (403|200) /);
      const closed = s.closed ? Promise.resolve() : new Promise((r) => s.once('close', r));
      s.end();
      await closed;
    }
    // Each connection above was the only one while it lasted; the next is served too (not 503).
    const last = await untilNot503(sockPath, `CONNECT 127.0.0.1:${await closedPort()} HTTP/1.1\r\n\r\n`);
    expect(last.status).toBe(502);
  });

  // A refused program usually has more to send (its request after a 503, a body after a 403): the
  // proxy must still see its connection end, or the refused connection keeps its place for the run.
  it.each([
    ['503 (too many), the request sent anyway', 1, 'GET http://127.0.0.1/ HTTP/1.1\r\n\r\n', ''],
    ['403, the body sent after the head', 0, 'POST http://not-listed.example/ HTTP/1.1\r\nContent-Length: 4\r\n\r\n', 'body'],
  ])('a connection refused with %s frees its place', async (_name, idle, head, body) => {
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], maxConnections: 1 });
    const holders: net.Socket[] = [];
    for (let i = 0; i < idle; i++) holders.push(await connectUnix(sockPath));
    await new Promise((r) => setTimeout(r, 50));
    const refused = await exchange(sockPath, head, ...(body ? [body] : []));
    expect(refused.status).toBe(idle ? 503 : 403);
    for (const h of holders) h.destroy();

    const next = await untilNot503(sockPath, `CONNECT 127.0.0.1:${await closedPort()} HTTP/1.1\r\n\r\n`);

    expect(next.status).toBe(502);
  });

  it('a tunnel idle for longer than the connect timeout stays open', async () => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], connectTimeoutMs: 250 });
    const s = await connectUnix(sockPath);
    s.write(`CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\n\r\n`);
    await readUntil(s, (b) => b.length >= ESTABLISHED.length);
    await new Promise((r) => setTimeout(r, 750));
    s.write('still here\n');
    expect((await readUntil(s, (b) => b.includes('\n'))).toString()).toBe('still here\n');
  });

  it('an upstream that resets the connection ends the tunnel, with nothing added to the stream', async () => {
    const server = net.createServer((up) => {
      up.on('error', () => {});
      up.on('data', (d: Buffer) => (d.toString().includes('RESET') ? up.resetAndDestroy() : up.write(d)));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    const { port } = server.address() as net.AddressInfo;
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const s = await connectUnix(sockPath);
    const all = readToClose(s);

    s.write(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\n\r\n`);
    await new Promise((r) => setTimeout(r, 50));
    s.write('echo me\n');
    await new Promise((r) => setTimeout(r, 50));
    s.write('RESET\n');

    expect((await all).toString('latin1')).toBe(`${ESTABLISHED}echo me\n`);
  });
});

describe('EgressProxy: a slow upstream', () => {
  /**
   * An HTTP upstream slow to take connections: its accept queue (backlog 0) is held full for a while,
   * so a new connection completes only on the kernel's SYN retry (about a second later). It answers
   * each request with the bytes it received (all of them, or what came within 1.5 s).
   */
  async function startSlowAcceptUpstream(holdMs: number): Promise<number> {
    const script = [
      'import socket, sys, threading, time',
      's = socket.socket()',
      "s.bind(('127.0.0.1', 0))",
      's.listen(0)',
      'print(s.getsockname()[1], flush=True)',
      'def serve(c):',
      "    got = b''",
      '    c.settimeout(1.5)',
      "    while b'hello' not in got:",
      '        try: d = c.recv(65536)',
      '        except socket.timeout: break',
      '        if not d: break',
      '        got += d',
      "    c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n' % len(got) + got)",
      '    c.close()',
      `time.sleep(${holdMs / 1000})`,
      'filler, _ = s.accept()',
      'while True:',
      '    c, _ = s.accept()',
      '    threading.Thread(target=serve, args=(c,), daemon=True).start()',
    ].join('\n');
    const py = spawn('python3', ['-c', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    cleanups.push(() => py.kill());
    const port = await new Promise<number>((r) => py.stdout!.once('data', (d: Buffer) => r(Number(d.toString().trim()))));
    const filler = net.connect({ host: '127.0.0.1', port });
    cleanups.push(() => filler.destroy());
    await new Promise((r) => filler.once('connect', r));
    return port;
  }

  it('delivers the body a program sends while the proxy is still connecting', async () => {
    const port = await startSlowAcceptUpstream(200);
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'], connectTimeoutMs: 5000 });

    // The body follows the head 100 ms later, long before the connection to the upstream completes.
    const res = await exchange(sockPath, `POST http://127.0.0.1:${port}/slow HTTP/1.1\r\nContent-Length: 5\r\n\r\n`, Buffer.alloc(0), Buffer.alloc(0), Buffer.alloc(0), 'hello');

    expect(res.status).toBe(200);
    expect(res.body).toBe(`POST /slow HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello`);
  }, 10_000);
});

describe('EgressProxy: a program that drops its end of a tunnel', () => {
  it('the upstream connection is closed too, also when the drop is an error (unread data: a reset)', async () => {
    let upstreamClosed!: () => void;
    const closed = new Promise<void>((r) => (upstreamClosed = r));
    const server = net.createServer((up) => {
      up.on('error', () => {});
      up.once('close', () => upstreamClosed());
      setTimeout(() => up.write(Buffer.alloc(4 * 1024 * 1024, 'u')), 100);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    const { port } = server.address() as net.AddressInfo;
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const s = await connectUnix(sockPath);
    s.write(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\n\r\n`);
    await readUntil(s, (b) => b.length >= ESTABLISHED.length);
    // Stop reading, let more of the upstream's bytes reach the socket than its buffers hold, then close
    // it with them unread.
    s.pause();
    await new Promise((r) => setTimeout(r, 300));
    s.destroy();

    const outcome = await Promise.race([closed.then(() => 'closed'), new Promise((r) => setTimeout(() => r('still open after 3 s'), 3000))]);
    expect(outcome).toBe('closed');
  });
});

describe('EgressProxy: more of what a program can do', () => {
  it('header bytes outside ASCII reach the upstream unchanged', async () => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const s = await connectUnix(sockPath);
    s.write(Buffer.concat([Buffer.from(`GET http://127.0.0.1:${echo.port}/ HTTP/1.1\r\nX-Name: caf`, 'latin1'), Buffer.from([0xe9, 0xff]), Buffer.from('\r\n\r\n')]));
    const forwarded = await readUntil(s, (b) => b.includes('\r\n\r\n'));
    const line = forwarded.subarray(forwarded.indexOf('X-Name: '), forwarded.indexOf('\r\n', forwarded.indexOf('X-Name: ')));
    expect([...line]).toEqual([...Buffer.from('X-Name: caf', 'latin1'), 0xe9, 0xff]);
  });

  it('a failure while handling a request ends the program’s connection instead of leaving it hanging', async () => {
    const { sockPath } = await startProxy({
      allowedHosts: ['127.0.0.1'],
      onDecision: () => {
        throw new Error('the decision log failed');
      },
    });
    const res = await exchange(sockPath, 'CONNECT 127.0.0.1:9 HTTP/1.1\r\n\r\n');
    expect(res.raw.length).toBe(0);
  });

  it('allows 64 connections at once by default; the 65th is refused with 503', async () => {
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const open: net.Socket[] = [];
    for (let i = 0; i < 64; i++) open.push(await connectUnix(sockPath));
    await new Promise((r) => setTimeout(r, 100));
    const res = await exchange(sockPath, 'GET http://127.0.0.1/ HTTP/1.1\r\n\r\n');
    expect(res.status).toBe(503);
    expect(open.every((s) => !s.destroyed)).toBe(true);
    open.pop()!.destroy();
    const next = await untilNot503(sockPath, `CONNECT 127.0.0.1:${await closedPort()} HTTP/1.1\r\n\r\n`);
    expect(next.status).toBe(502);
  });

  it('refuses to listen on a socket path that is taken', async () => {
    const { sockPath } = await startProxy({ allowedHosts: [] });
    await expect(EgressProxy.listen(sockPath, { allowedHosts: [] })).rejects.toMatchObject({ code: 'EADDRINUSE' });
  });
});

describe('EgressProxy: which headers are hop-by-hop', () => {
  it('a hop-by-hop header written with a space before its colon is dropped too (no proxy credentials upstream)', async () => {
    const echo = await startEchoUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const s = await connectUnix(sockPath);
    s.write(`GET http://127.0.0.1:${echo.port}/ HTTP/1.1\r\nProxy-Authorization : Basic c2VjcmV0\r\nHost : evil.example\r\nX-Kept: 1\r\n\r\n`);
    const forwarded = (await readUntil(s, (b) => b.includes('\r\n\r\n'))).toString('latin1');
    expect(forwarded).toBe(`GET / HTTP/1.1\r\nHost: 127.0.0.1:${echo.port}\r\nX-Kept: 1\r\nConnection: close\r\n\r\n`);
  });

  it('only the Connection header names headers to drop: another header whose value names one leaves it', async () => {
    const up = await startHttpUpstream();
    const { sockPath } = await startProxy({ allowedHosts: ['127.0.0.1'] });
    const res = await exchange(sockPath, `GET http://127.0.0.1:${up.port}/ HTTP/1.1\r\nVary: X-Kept, Accept\r\nX-Kept: 1\r\nAccept: */*\r\n\r\n`);
    expect(res.status).toBe(200);
    expect(up.seen[0]!.headers).toMatchObject({ vary: 'X-Kept, Accept', 'x-kept': '1', accept: '*/*' });
  });
});
