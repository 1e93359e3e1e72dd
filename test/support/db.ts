/**
 * Test databases. `SANDPOD_TEST_DB=postgres|pglite` chooses; unset, PostgreSQL at
 * `SANDPOD_TEST_PG` (default postgres://postgres@127.0.0.1:5432/test) is used when reachable and
 * PGlite otherwise — except with `SANDPOD_REQUIRE_POSTGRES=1` (CI), where an unreachable server fails.
 * Every call gets a fresh database (PostgreSQL: a new database; PGlite: a new directory).
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { createDb, type Db } from '../../src/store/database.ts';
import { migrateToLatest } from '../../src/store/migrate.ts';

const ADMIN_URL = process.env.SANDPOD_TEST_PG ?? 'postgres://postgres@127.0.0.1:5432/test';

let reachable: Promise<boolean> | null = null;
async function postgresReachable(): Promise<boolean> {
  reachable ??= (async () => {
    const c = new pg.Client({ connectionString: ADMIN_URL, connectionTimeoutMillis: 2000 });
    try {
      await c.connect();
      await c.query('SELECT 1');
      return true;
    } catch {
      return false;
    } finally {
      await c.end().catch(() => {});
    }
  })();
  return reachable;
}

/** Which backend this run uses. */
export async function testDbKind(): Promise<'postgres' | 'pglite'> {
  const want = process.env.SANDPOD_TEST_DB;
  if (want === 'pglite') return 'pglite';
  const ok = await postgresReachable();
  if (want === 'postgres' || process.env.SANDPOD_REQUIRE_POSTGRES === '1') {
    if (!ok) throw new Error(`PostgreSQL required for tests but not reachable at ${ADMIN_URL}`);
    return 'postgres';
  }
  return ok ? 'postgres' : 'pglite';
}

/** A fresh database: `url` for PostgreSQL (null for PGlite) and a workspace directory. */
export interface TestDatabase {
  kind: 'postgres' | 'pglite';
  url: string | null;
  workspace: string;
  drop(): Promise<void>;
}

/** Creates a fresh database for one test file or test. */
export async function freshDatabase(): Promise<TestDatabase> {
  const kind = await testDbKind();
  const workspace = mkdtempSync(path.join(tmpdir(), 'sandpod-ws-'));
  chmodSync(workspace, 0o755); // the sandbox user (uid 1000) must traverse it
  if (kind === 'pglite') return { kind, url: null, workspace, drop: async () => unmountUnder(workspace) };
  const name = `sandpod_t_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  const admin = new pg.Client({ connectionString: ADMIN_URL });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  return {
    kind,
    url: url.toString(),
    workspace,
    async drop() {
      unmountUnder(workspace);
      const a = new pg.Client({ connectionString: ADMIN_URL });
      await a.connect();
      await a.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
      await a.end();
    },
  };
}

/**
 * Two handles on one migrated database, as two processes would hold them: `listener` and `writer`
 * are separate pools on PostgreSQL; on PGlite (one process's database) they are the same handle.
 */
export async function connectionPair(database: TestDatabase): Promise<{ listener: Db; writer: Db; close(): Promise<void> }> {
  const listener = await createDb({ url: database.url, workspace: database.workspace });
  await migrateToLatest(listener.kysely);
  const writer = database.url ? await createDb({ url: database.url, workspace: database.workspace }) : listener;
  return {
    listener,
    writer,
    async close() {
      if (writer !== listener) await writer.destroy();
      await listener.destroy();
    },
  };
}

/**
 * Lazily unmounts whatever is mounted below `dir` (the local runtime's tmpfs for run outputs stays
 * mounted when a test kills a service with SIGKILL).
 */
export function unmountUnder(dir: string): void {
  let mounts: string[];
  try {
    mounts = readFileSync('/proc/mounts', 'utf8').split('\n').map((l) => l.split(' ')[1] ?? '');
  } catch {
    return;
  }
  for (const m of mounts.filter((p) => p.startsWith(`${dir}/`)).sort().reverse()) spawnSync('umount', ['-l', m]);
}
