/**
 * Service processes on one fresh PostgreSQL database, for a describe block: the database is made
 * before the block's tests, and every process started through {@link useServiceProcesses} is killed
 * (and the database dropped) after them, whatever the tests left running.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll } from 'vitest';
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
  beforeAll(async () => {
    db = await freshDatabase();
  });
  afterAll(async () => {
    for (const p of procs) p.kill('SIGKILL');
    await Promise.all(procs.map((p) => p.exited));
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
        mkdirSync(workspace, { recursive: true, mode: 0o755 });
      }
      const p = await startServiceProcess({ databaseUrl: d.url!, workspace, name, ...(config ? { config } : {}), ...(o?.env ? { env: o.env } : {}) });
      procs.push(p);
      return p;
    },
  };
}
