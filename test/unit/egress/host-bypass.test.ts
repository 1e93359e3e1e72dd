/**
 * Issue 22 item 1: the allowlist bypass `CONNECT 44.1.2.3\0.wild.test:PORT` with `*.wild.test` allowed
 * (the name matched the pattern, then getaddrinfo stopped at the NUL and the proxy dialled 44.1.2.3).
 * Here against the real EgressProxy on a TCP socket, alone and shared (with a run credential), with
 * the resolver and the dialler recorded: a malformed host is 400, never looked up, never dialled.
 */
import { promises as dns } from 'node:dns';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { startClusterEgressProxy } from '../../../src/egress/cluster.ts';
import { EgressProxy, type Dial, type EgressProxyOptions, type Lookup } from '../../../src/egress/proxy.ts';
import { signEgressToken } from '../../../src/egress/token.ts';
import { createLogger } from '../../../src/logger.ts';

const KEY = 'a-shared-key-of-at-least-32-bytes!!';
const RUN = '11111111-1111-4111-8111-111111111111';
const PORT = 8443;
const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of closers.splice(0)) await c();
});

/** The system resolver and a dialler that refuses, both recording what they were asked. */
function recorders(): { lookups: string[]; dials: string[]; lookup: Lookup; dial: Dial } {
  const lookups: string[] = [];
  const dials: string[] = [];
  return {
    lookups,
    dials,
    lookup: async (host) => {
      lookups.push(host);
      return dns.lookup(host, { all: true, verbatim: true });
    },
    dial: (address, port) => {
      dials.push(`${address}:${port}`);
      // Nothing must be reached: an unroutable port on loopback, refused at once.
      return net.connect({ host: '127.0.0.1', port: 9 });
    },
  };
}

function send(port: number, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => s.write(request, 'latin1'));
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('close', () => resolve(got));
    s.on('error', reject);
  });
}

async function plainProxy(o: EgressProxyOptions): Promise<EgressProxy> {
  const p = await EgressProxy.listenTcp(0, '127.0.0.1', o);
  closers.push(() => p.close());
  return p;
}

const auth = () => `Proxy-Authorization: Basic ${Buffer.from(`${RUN}:${signEgressToken({ executionId: RUN, allowedHosts: ['*.wild.test'], expiresAtMs: Date.now() + 60_000 }, KEY)}`).toString('base64')}\r\n`;

describe('the reported bypass: a NUL inside a host that matches *.wild.test', () => {
  it('CONNECT 44.1.2.3\\0.wild.test:PORT is 400, with no lookup and no dial (one run\'s proxy)', async () => {
    const r = recorders();
    const proxy = await plainProxy({ allowedHosts: ['*.wild.test'], lookup: r.lookup, dial: r.dial, connectTimeoutMs: 1000 });
    const answer = await send(proxy.port, `CONNECT 44.1.2.3\0.wild.test:${PORT} HTTP/1.1\r\nHost: x\r\n\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect(answer).toContain('malformed host "44.1.2.3\\u0000.wild.test"');
    expect(r.lookups).toEqual([]);
    expect(r.dials).toEqual([]);
  });

  it.each([
    ['CONNECT', `CONNECT 44.1.2.3\0.wild.test:${PORT} HTTP/1.1\r\n`],
    ['absolute-form', `GET http://44.1.2.3\0.wild.test:${PORT}/ HTTP/1.1\r\n`],
    ['CONNECT, %00', `CONNECT 44.1.2.3%00.wild.test:${PORT} HTTP/1.1\r\n`],
    ['absolute-form, %00', `GET http://44.1.2.3%00.wild.test:${PORT}/ HTTP/1.1\r\n`],
    ['CONNECT, a full-width dot', `CONNECT 44.1.2.3\u3002wild.test:${PORT} HTTP/1.1\r\n`],
    ['absolute-form, credentials', `GET http://x@44.1.2.3\0.wild.test:${PORT}/ HTTP/1.1\r\n`],
  ])('the shared proxy with a valid credential: %s is 400, no lookup, no dial', async (_name, line) => {
    const r = recorders();
    const logger = createLogger('silent', 'json');
    const proxy = await startClusterEgressProxy({ key: KEY, port: 0, host: '127.0.0.1', logger, lookup: r.lookup, dial: r.dial, connectTimeoutMs: 1000 });
    closers.push(() => proxy.close());
    const answer = await send(proxy.port, `${line}${auth()}\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect(r.lookups).toEqual([]);
    expect(r.dials).toEqual([]);
  });

  it('the well-formed name next to it still goes through the pattern, the lookup and the dial', async () => {
    const r = recorders();
    const lookup: Lookup = async (host) => {
      r.lookups.push(host);
      return [{ address: '44.1.2.3', family: 4 }];
    };
    const proxy = await plainProxy({ allowedHosts: ['*.wild.test'], lookup, dial: r.dial, connectTimeoutMs: 1000 });
    const answer = await send(proxy.port, `CONNECT a.wild.test.:${PORT} HTTP/1.1\r\n\r\n`);
    expect(answer).toMatch(/^HTTP\/1\.1 502 /);
    expect(r.lookups).toEqual(['a.wild.test']);
    expect(r.dials).toEqual([`44.1.2.3:${PORT}`]);
  });
});
