/**
 * Issue 22 item 6: one run pod could cut egress for every run (1,024 idle connections filled the
 * shared proxy's cap). The cluster proxy on real sockets: connections without a head are capped per
 * source and cut at the head deadline; connections past their head are capped per run; the global
 * cap counts only those; tunnels idle too long are closed; /readyz reports saturation.
 * Different pods are different loopback source addresses (127.0.0.2 is "pod A").
 */
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Admission } from '../../../src/egress/admission.ts';
import { startClusterEgressProxy, type ClusterEgressOptions } from '../../../src/egress/cluster.ts';
import { startEgressHealthServer } from '../../../src/egress/health.ts';
import type { EgressProxy } from '../../../src/egress/proxy.ts';
import { signEgressToken } from '../../../src/egress/token.ts';
import { createLogger } from '../../../src/logger.ts';

const KEY = 'a-shared-key-of-at-least-32-bytes!!';
const RUN_A = '11111111-1111-4111-8111-111111111111';
const RUN_B = '22222222-2222-4222-8222-222222222222';
const ESTABLISHED = 'HTTP/1.1 200 Connection Established\r\n\r\n';

let echo: net.Server;
let echoPort: number;
const cleanups: Array<() => unknown> = [];
beforeAll(async () => {
  echo = net.createServer((s) => {
    s.on('error', () => {});
    s.pipe(s);
  });
  await new Promise<void>((r) => echo.listen(0, '127.0.0.1', () => r()));
  echoPort = (echo.address() as net.AddressInfo).port;
});
afterAll(() => echo.close());
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function proxyWith(o: Partial<ClusterEgressOptions> = {}): Promise<EgressProxy> {
  const p = await startClusterEgressProxy({ key: KEY, port: 0, host: '127.0.0.1', logger: createLogger('silent', 'json'), ...o });
  cleanups.push(() => p.close());
  return p;
}

const auth = (run: string) =>
  `Proxy-Authorization: Basic ${Buffer.from(`${run}:${signEgressToken({ executionId: run, allowedHosts: [`127.0.0.1:${echoPort}`], expiresAtMs: Date.now() + 600_000 }, KEY)}`).toString('base64')}\r\n`;

/** A connection to the proxy from `from` (a loopback address standing for a pod), collecting what it receives. */
function open(proxy: EgressProxy, from = '127.0.0.1'): Promise<{ s: net.Socket; got: () => string; closed: Promise<void> }> {
  return new Promise((resolve, reject) => {
    let got = '';
    const s = net.connect({ host: '127.0.0.1', port: proxy.port, localAddress: from });
    cleanups.push(() => s.destroy());
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('error', () => {});
    const closed = new Promise<void>((r) => s.once('close', () => r()));
    s.once('connect', () => resolve({ s, got: () => got, closed }));
    s.once('error', reject);
  });
}

async function until(cond: () => boolean, what: string, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Opens a tunnel of `run` to the echo server and checks it relays; rejects with what the proxy said otherwise. */
async function tunnel(proxy: EgressProxy, run: string, from = '127.0.0.1'): Promise<net.Socket> {
  const c = await open(proxy, from);
  c.s.write(`CONNECT 127.0.0.1:${echoPort} HTTP/1.1\r\n${auth(run)}\r\n`);
  await until(() => c.got().includes('\r\n\r\n') || c.s.destroyed, 'an answer to CONNECT');
  if (!c.got().startsWith(ESTABLISHED)) throw new Error(c.got() || 'closed without an answer');
  c.s.write('ping\n');
  await until(() => c.got().endsWith('ping\n'), 'the echo through the tunnel');
  return c.s;
}

describe('one pod cannot cut egress for the others', () => {
  it('1,024 idle connections from pod A: run B\'s CONNECT still opens a tunnel', async () => {
    const proxy = await proxyWith();
    const idle = [];
    for (let i = 0; i < 1024; i++) idle.push(await open(proxy, '127.0.0.2'));
    await until(() => proxy.stats().pending > 0, 'the idle connections accepted');
    // Pod A keeps its places only up to the per-source cap; the rest were refused at once.
    expect(proxy.stats()).toMatchObject({ pending: 64, admitted: 0, saturated: false });
    expect(idle.filter((c) => c.got().startsWith('HTTP/1.1 503 ')).length).toBeGreaterThanOrEqual(1024 - 64 - 1);

    const b = await tunnel(proxy, RUN_B);
    expect(b.destroyed).toBe(false);
  }, 60_000);

  it('run A holding its per-run cap of tunnels: A\'s next is 503, run B\'s opens', async () => {
    const proxy = await proxyWith({ maxConnectionsPerRun: 8 });
    for (let i = 0; i < 8; i++) await tunnel(proxy, RUN_A, '127.0.0.2');
    await expect(tunnel(proxy, RUN_A, '127.0.0.2')).rejects.toThrow(/^HTTP\/1\.1 503 Service Unavailable[\s\S]*too many connections of this run through the egress proxy \(at most 8\)/);
    expect(proxy.stats().admitted).toBe(8);
    await tunnel(proxy, RUN_B);
    expect(proxy.stats().admitted).toBe(9);
  });

  it('the global cap counts connections past a valid head only: refused credentials and silent sockets do not take places', async () => {
    const proxy = await proxyWith({ maxConnections: 2, maxPendingConnections: 16 });
    for (let i = 0; i < 5; i++) await open(proxy, '127.0.0.3');
    const forged = await open(proxy, '127.0.0.4');
    forged.s.write(`CONNECT 127.0.0.1:${echoPort} HTTP/1.1\r\n${auth(RUN_A).replace(/.{4}\r\n$/, 'AAAA\r\n')}\r\n`);
    await until(() => forged.got().startsWith('HTTP/1.1 407 '), 'the 407');
    await tunnel(proxy, RUN_A);
    await tunnel(proxy, RUN_B);
    expect(proxy.stats()).toMatchObject({ admitted: 2, saturated: true });
    await expect(tunnel(proxy, RUN_B)).rejects.toThrow(/^HTTP\/1\.1 503 [\s\S]*too many connections through the egress proxy/);
  });
});

describe('deadlines', () => {
  it('a connection that sends nothing is answered 408 and closed at the head deadline, and its place is free again', async () => {
    const proxy = await proxyWith({ headTimeoutMs: 300 });
    const started = Date.now();
    const c = await open(proxy, '127.0.0.2');
    await c.closed;
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    expect(c.got()).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n[\s\S]*request head not received within 300 ms\n$/);
    expect(proxy.stats().pending).toBe(0);
  });

  it('the deadline is for the whole head: one byte at a time does not extend it', async () => {
    const proxy = await proxyWith({ headTimeoutMs: 400 });
    const c = await open(proxy, '127.0.0.2');
    const drip = setInterval(() => (c.s.destroyed ? undefined : c.s.write('X')), 50);
    cleanups.push(() => clearInterval(drip));
    c.s.write('CONNECT ');
    await c.closed;
    expect(c.got()).toMatch(/^HTTP\/1\.1 408 /);
  });

  it('a tunnel with no traffic either way is closed after the idle timeout; one with traffic stays', async () => {
    const proxy = await proxyWith({ idleTimeoutMs: 300 });
    const quiet = await tunnel(proxy, RUN_A);
    const busy = await tunnel(proxy, RUN_B);
    const quietClosed = new Promise<number>((r) => quiet.once('close', () => r(Date.now())));
    const start = Date.now();
    for (let i = 0; i < 9; i++) {
      await new Promise((r) => setTimeout(r, 100));
      busy.write('.');
    }
    expect((await quietClosed) - start).toBeLessThan(900);
    expect(busy.destroyed).toBe(false);
    await until(() => proxy.stats().admitted === 1, 'the quiet tunnel released');
  });
});

describe('readiness', () => {
  it('/readyz is 200 with room, 503 "saturated" at the cap, 200 again once a place frees', async () => {
    const proxy = await proxyWith({ maxConnections: 1 });
    const health = await startEgressHealthServer(0, '127.0.0.1', () => proxy.stats());
    cleanups.push(() => health.close());
    const ready = async () => {
      const r = await fetch(`http://127.0.0.1:${health.port}/readyz`);
      return [r.status, ((await r.json()) as { status: string }).status];
    };
    expect(await ready()).toEqual([200, 'ready']);
    const t = await tunnel(proxy, RUN_A);
    expect(await ready()).toEqual([503, 'saturated']);
    expect((await fetch(`http://127.0.0.1:${health.port}/livez`)).status).toBe(200);
    t.destroy();
    await until(() => proxy.stats().admitted === 0, 'the tunnel released');
    expect(await ready()).toEqual([200, 'ready']);
    expect((await fetch(`http://127.0.0.1:${health.port}/other`)).status).toBe(404);
  });
});

describe('Admission (the bookkeeping)', () => {
  it.each<[string, Array<['open' | 'close', string] | ['admit' | 'release', string]>, Array<boolean | string>]>([
    ['pending per source', [['open', 'a'], ['open', 'a'], ['open', 'a'], ['open', 'b']], [true, true, false, true]],
    ['pending in total', [['open', 'a'], ['open', 'b'], ['open', 'c'], ['open', 'd']], [true, true, true, false]],
    ['a closed pending place is reused', [['open', 'a'], ['open', 'a'], ['close', 'a'], ['open', 'a']], [true, true, true, true]],
    ['admitted per run', [['admit', 'r'], ['admit', 'r'], ['admit', 'r'], ['admit', 's']], [true, true, 'run', true]],
    ['admitted in total', [['admit', 'r'], ['admit', 's'], ['admit', 't'], ['admit', 'u']], [true, true, true, 'total']],
    ['release frees a place; a stray release changes nothing', [['admit', 'r'], ['admit', 'r'], ['release', 'x'], ['release', 'r'], ['admit', 'r']], [true, true, true, true, true]],
    ['a stray release frees no place in total', [['admit', 'r'], ['admit', 's'], ['admit', 't'], ['release', 'x'], ['admit', 'u']], [true, true, true, true, 'total']],
    ['a stray close frees no pending place in total', [['open', 'a'], ['open', 'b'], ['open', 'c'], ['close', 'x'], ['open', 'd']], [true, true, true, true, false]],
    ['closing one of two pending keeps the other counted', [['open', 'a'], ['open', 'a'], ['close', 'a'], ['open', 'a'], ['open', 'a']], [true, true, true, true, false]],
    ['releasing one of two keeps the other counted', [['admit', 'r'], ['admit', 'r'], ['release', 'r'], ['admit', 'r'], ['admit', 'r']], [true, true, true, true, 'run']],
  ])('%s', (_name, steps, expected) => {
    const a = new Admission({ maxConnections: 3, maxConnectionsPerRun: 2, maxPending: 3, maxPendingPerSource: 2 });
    const got = steps.map(([op, key]) => {
      if (op === 'open') return a.openPending(key);
      if (op === 'close') return (a.closePending(key), true);
      if (op === 'release') return (a.release(key), true);
      const r = a.admit(key);
      if ('admitted' in r) return (expect(r).toEqual({ admitted: true }), true);
      return r.refused.includes('of this run') ? 'run' : 'total';
    });
    expect(got).toEqual(expected);
  });

  it('stats: saturated when either total is at its cap', () => {
    const a = new Admission({ maxConnections: 1, maxConnectionsPerRun: 1, maxPending: 2, maxPendingPerSource: 2 });
    expect(a.stats()).toEqual({ admitted: 0, pending: 0, maxConnections: 1, maxPending: 2, saturated: false });
    a.openPending('a');
    expect(a.stats()).toMatchObject({ pending: 1, saturated: false });
    a.openPending('a');
    expect(a.stats()).toMatchObject({ pending: 2, saturated: true });
    a.closePending('a');
    a.admit('r');
    expect(a.stats()).toMatchObject({ admitted: 1, pending: 1, saturated: true });
  });

  it('refuses a limit below 1', () => {
    expect(() => new Admission({ maxConnections: 0, maxConnectionsPerRun: 1, maxPending: 1, maxPendingPerSource: 1 })).toThrow(/maxConnections: must be a positive integer/);
  });
});
