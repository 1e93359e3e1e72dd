/** Set-up shared by the direct store tests (a vitest file: bench code imports db.ts, not this). */
import { afterAll, beforeAll, beforeEach } from 'vitest';
import type { Database, Db } from '../../src/store/database.ts';
import { connectionPair, freshDatabase, type TestDatabase } from './db.ts';

/**
 * For a test file of direct store tests: a fresh database and its two connections (listener, writer),
 * made before the file's tests and dropped after; `tables` are emptied before each test. Read the
 * fields inside tests or hooks registered after this call.
 */
export function usePairedDatabase(tables: readonly (keyof Database)[]): { database: TestDatabase; db: Db; other: Db } {
  const t = {} as { database: TestDatabase; db: Db; other: Db };
  let close: (() => Promise<void>) | undefined;
  beforeAll(async () => {
    t.database = await freshDatabase();
    const pair = await connectionPair(t.database);
    ({ listener: t.db, writer: t.other } = pair);
    close = pair.close;
  });
  afterAll(async () => {
    await close?.();
    await t.database?.drop();
  });
  beforeEach(async () => {
    for (const table of tables) await t.db.kysely.deleteFrom(table).execute();
  });
  return t;
}
