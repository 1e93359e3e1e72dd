/**
 * A throwaway PostgreSQL server of its own (initdb in a temp dir, a free port, a private socket
 * directory) for fault tests that stop, restart or kill the server: the shared one on :5432 serves
 * other tests at the same time and must never be touched. Runs as the `postgres` OS user when this
 * process is root (initdb refuses root).
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { freePort } from './process.ts';

const BIN = process.env.SANDPOD_PG_BIN ?? '/usr/lib/postgresql/15/bin';

/** Why a private server cannot be started here, or null when it can. */
export function privatePgUnavailable(): string | null {
  if (!existsSync(path.join(BIN, 'initdb')) || !existsSync(path.join(BIN, 'pg_ctl'))) return `PostgreSQL server binaries not found in ${BIN} (set SANDPOD_PG_BIN)`;
  if (userInfo().uid === 0 && spawnSync('id', ['-u', 'postgres']).status !== 0) return 'running as root and there is no postgres OS user for initdb';
  return null;
}

/** A private server; `url` points at its database `faults`. */
export interface PrivatePg {
  url: string;
  port: number;
  /** pg_ctl stop (fast: sessions are terminated, as in a service restart). */
  stop(): void;
  start(): void;
  restart(): void;
  /** Stops the server and removes its files. */
  destroy(): void;
}

/** initdb + start + CREATE DATABASE faults. */
export async function startPrivatePg(): Promise<PrivatePg> {
  const dir = mkdtempSync(path.join(tmpdir(), 'sandpod-pg-'));
  chmodSync(dir, 0o755);
  const data = path.join(dir, 'data');
  const sock = path.join(dir, 'sock');
  mkdirSync(sock);
  const asRoot = userInfo().uid === 0;
  if (asRoot) {
    const uid = Number(spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).stdout.trim());
    const gid = Number(spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).stdout.trim());
    chownSync(dir, uid, gid);
    chownSync(sock, uid, gid);
  }
  const run = (bin: string, args: string[]) => {
    const cmd = asRoot ? ['runuser', ['-u', 'postgres', '--', path.join(BIN, bin), ...args]] : [path.join(BIN, bin), args];
    const r = spawnSync(cmd[0] as string, cmd[1] as string[], { encoding: 'utf8', timeout: 60_000 });
    if (r.status !== 0) throw new Error(`${bin} ${args.join(' ')} failed (${r.status}): ${r.stdout}${r.stderr}`);
  };
  run('initdb', ['-D', data, '-U', 'postgres', '--auth=trust', '-N']);
  const port = await freePort();
  const opts = `-p ${port} -k ${sock} -c listen_addresses=127.0.0.1 -c fsync=off`;
  const ctl = (action: string, extra: string[] = []) => run('pg_ctl', ['-D', data, '-o', opts, '-w', '-t', '60', ...extra, action]);
  ctl('start', ['-l', path.join(dir, 'log')]);
  const admin = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${port}/postgres` });
  await admin.connect();
  await admin.query('CREATE DATABASE faults');
  await admin.end();
  let up = true;
  return {
    url: `postgres://postgres@127.0.0.1:${port}/faults`,
    port,
    stop() {
      ctl('stop', ['-m', 'fast']);
      up = false;
    },
    start() {
      ctl('start', ['-l', path.join(dir, 'log')]);
      up = true;
    },
    restart() {
      ctl('restart', ['-m', 'fast', '-l', path.join(dir, 'log')]);
      up = true;
    },
    destroy() {
      if (up) {
        try {
          ctl('stop', ['-m', 'immediate']);
        } catch {
          // already gone
        }
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
