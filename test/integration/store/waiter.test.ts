/**
 * The result long-poll is woken by the completion NOTIFY (from any connection, as another process
 * would send it), not by polling: a terminal row written without a NOTIFY is not noticed before the
 * wait runs out.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DONE_CHANNEL } from '../../../src/queue/channels.ts';
import { CompletionWaiter } from '../../../src/executions/waiter.ts';
import type { Db } from '../../../src/store/database.ts';
import { connectionPair, freshDatabase, type TestDatabase } from '../../support/db.ts';
import { seedHistory } from '../../support/seed.ts';

let database: TestDatabase;
let listener: Db;
let writer: Db;
let closePair: () => Promise<void>;
let waiter: CompletionWaiter;
beforeAll(async () => {
  database = await freshDatabase();
  // PostgreSQL: a second pool, as another process; PGlite is one process's database.
  ({ listener, writer, close: closePair } = await connectionPair(database));
  await seedHistory(listener.kysely, 2);
  await sql`UPDATE executions SET status = 'running'`.execute(listener.kysely);
  waiter = new CompletionWaiter(listener);
  await waiter.start();
});
afterAll(async () => {
  await waiter?.stop();
  await closePair?.();
  await database?.drop();
});

describe('CompletionWaiter', () => {
  it('wakes on the NOTIFY of the completion', async () => {
    const t0 = performance.now();
    const waiting = waiter.wait('seed-1', 20_000);
    setTimeout(() => {
      void sql`WITH u AS (UPDATE executions SET status = 'succeeded' WHERE id = 'seed-1' RETURNING id) SELECT pg_notify(${DONE_CHANNEL}, id) FROM u`.execute(writer.kysely);
    }, 200);
    const row = await waiting;
    expect(row?.status).toBe('succeeded');
    expect(performance.now() - t0).toBeLessThan(5_000);
  });

  it('does not notice a completion that sent no NOTIFY until its timeout (it does not poll)', async () => {
    const t0 = performance.now();
    const waiting = waiter.wait('seed-2', 1_500);
    setTimeout(() => void sql`UPDATE executions SET status = 'succeeded' WHERE id = 'seed-2'`.execute(writer.kysely), 100);
    const row = await waiting;
    expect(performance.now() - t0).toBeGreaterThanOrEqual(1_400);
    expect(row?.status).toBe('succeeded'); // read once more when the wait ends
  });

  it('returns at once for a finished or unknown job', async () => {
    expect((await waiter.wait('seed-1', 20_000))?.status).toBe('succeeded');
    expect(await waiter.wait('no-such-job', 20_000)).toBeUndefined();
  });
});
