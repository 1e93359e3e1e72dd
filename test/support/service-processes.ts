/**
 * Service processes on one fresh PostgreSQL database, for a describe block: the database is made
 * before the block's tests, and every process started through {@link useServiceProcesses} is killed
 * (and the database dropped) after them, whatever the tests left running. A process started inside a
 * test is killed when that test (or that try of it: CI retries a failed test once) ends, so a retry
 * never meets the first try's processes still serving the queue.
 */
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach } from 'vitest';
import { freshDatabase, type TestDatabase } from './db.ts';
import { startServiceProcess, type ServiceProcess } from './process.ts';

/** What {@link useServiceProcesses} gives a describe block. */
export interface ServiceProcesses {
  /** The block's database (set once `beforeAll` ran). */
  db(): TestDatabase;
  /**
   * Starts a service process named `name` on the block's database. With `ownWorkspace`, it gets a
   * workspace directory of its own under the database's (two live processes must not share one).
   */
  start(name: string, config?: Record<string, unknown>, o?: { ownWorkspace?: boolean; env?: Record<string, string> }): Promise<ServiceProcess>;
}

/** Registers the block's hooks; call it at the top of a `describe`. */
export function useServiceProcesses(): ServiceProcesses {
  let db: TestDatabase | undefined;
  const procs: ServiceProcess[] = [];
  /** Started by the test now running (null outside a test: in beforeAll, for the whole block). */
  let testProcs: ServiceProcess[] | null = null;
  const killAll = async (list: ServiceProcess[]) => {
    for (const p of list) p.kill('SIGKILL');
    await Promise.all(list.map((p) => p.exited));
  };
  beforeAll(async () => {
    db = await freshDatabase();
  });
  beforeEach(() => {
    testProcs = [];
  });
  afterEach(async () => {
    const list = testProcs ?? [];
    testProcs = null;
    await killAll(list);
  });
  afterAll(async () => {
    await killAll(procs);
    await db?.drop();
  });
  const current = (): TestDatabase => {
    if (!db) throw new Error('useServiceProcesses: the database is made in beforeAll');
    return db;
  };
  return {
    db: current,
    async start(name, config, o) {
      const d = current();
      let workspace = d.workspace;
      if (o?.ownWorkspace) {
        workspace = path.join(d.workspace, name);
        // A retried test starts its processes again: each start gets a directory of its own.
        for (let n = 2; existsSync(workspace); n++) workspace = path.join(d.workspace, `${name}-${n}`);
        mkdirSync(workspace, { recursive: true, mode: 0o755 });
      }
      const p = await startServiceProcess({ databaseUrl: d.url!, workspace, name, ...(config ? { config } : {}), ...(o?.env ? { env: o.env } : {}) });
      procs.push(p);
      testProcs?.push(p);
      return p;
    },
  };
}
