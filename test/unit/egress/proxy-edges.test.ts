/** Edges of the shared proxy core that the per-runtime suites do not reach (mutation survivors). */
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { EgressProxy } from '../../../src/egress/proxy.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'sp-egress-edges-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function send(connect: net.NetConnectOpts, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect(connect, () => s.write(text));
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.on('close', () => resolve(got));
    s.on('error', reject);
  });
}

describe('proxy core', () => {
  it('reports its TCP port, and 0 on a Unix socket', async () => {
    const tcp = await EgressProxy.listenTcp(0, '127.0.0.1', { allowedHosts: [] });
    const unix = await EgressProxy.listen(path.join(dir, 'p.sock'), { allowedHosts: [] });
    try {
      expect(tcp.port).toBeGreaterThan(0);
      expect(unix.port).toBe(0);
    } finally {
      await tcp.close();
      await unix.close();
    }
  });

  it('listens on the host it is given', async () => {
    const tcp = await EgressProxy.listenTcp(0, '127.0.0.1', { allowedHosts: [] });
    try {
      const answer = await send({ host: '127.0.0.1', port: tcp.port }, 'GET http://203.0.113.9/ HTTP/1.1\r\nHost: 203.0.113.9\r\n\r\n');
      expect(answer).toMatch(/^HTTP\/1\.1 403 /);
      // Not on another local address of the machine's (the wildcard would take it).
      const other = await send({ host: '127.0.0.2', port: tcp.port }, 'x').then(() => 'answered', (e: NodeJS.ErrnoException) => e.code);
      expect(other).toBe('ECONNREFUSED');
    } finally {
      await tcp.close();
    }
  });

  it('with authentication and no decision hook, a refused credential is still a 407', async () => {
    const tcp = await EgressProxy.listenTcp(0, '127.0.0.1', { authenticate: (h) => (h ? { executionId: 'e', allowedHosts: [] } : { refused: 'missing' }) });
    try {
      const answer = await send({ host: '127.0.0.1', port: tcp.port }, 'GET http://203.0.113.9/ HTTP/1.1\r\nHost: 203.0.113.9\r\n\r\n');
      expect(answer).toMatch(/^HTTP\/1\.1 407 Proxy Authentication Required\r\n/);
    } finally {
      await tcp.close();
    }
  });
});
