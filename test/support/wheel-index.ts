/**
 * A find-links page over HTTP on the host's loopback, for tests that install from a wheel directory
 * through pip's network path (there is no PyPI here). `/` lists the directory's files; each is
 * served as is. A gated index holds every file download until {@link WheelIndex.open}: a build
 * that needs one of its wheels cannot finish before the test says so.
 */
import { readFileSync, readdirSync } from 'node:fs';
import http from 'node:http';
import type net from 'node:net';
import path from 'node:path';

export interface WheelIndex {
  port: number;
  /** The find-links URL. */
  url: string;
  /** Every path asked for, in order. */
  paths: () => string[];
  /** Lets held and later downloads through (a gated index only). */
  open: () => void;
  close: () => Promise<void>;
}

export async function serveWheelIndex(dir: string, opts: { gated?: boolean } = {}): Promise<WheelIndex> {
  const paths: string[] = [];
  let release: () => void = () => {};
  const gate = opts.gated ? new Promise<void>((r) => (release = r)) : Promise.resolve();
  const server = http.createServer((req, res) => {
    paths.push(req.url ?? '');
    const files = readdirSync(dir);
    const name = decodeURIComponent((req.url ?? '/').slice(1));
    if (name === '') {
      res.setHeader('Content-Type', 'text/html');
      res.end(`<html><body>${files.map((f) => `<a href="${f}">${f}</a>`).join('\n')}</body></html>`);
    } else if (files.includes(name)) void gate.then(() => res.end(readFileSync(path.join(dir, name))));
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    url: `http://127.0.0.1:${port}/`,
    paths: () => [...paths],
    open: () => release(),
    close: () =>
      new Promise((r) => {
        release();
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
