/**
 * `max_sessions` across processes (issue 19): the live count and the insert of a new session happen
 * in one transaction under an advisory lock, so two processes on one database (two pools here, as two
 * replicas hold them) never both take the last place.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { insertSessionAdmitted } from '../../../src/store/sessions.repository.ts';
import { connectionPair, freshDatabase, type TestDatabase } from '../../support/db.ts';

let database: TestDatabase;
let pair: Awaited<ReturnType<typeof connectionPair>>;
beforeAll(async () => {
  database = await freshDatabase();
  pair = await connectionPair(database);
});
afterAll(async () => {
  await pair?.close();
  await database?.drop();
});

const row = () => {
  const now = new Date();
  return { id: randomUUID(), status: 'starting', job_type: 'default', idle_timeout_s: 300, max_lifetime_s: 3600, cell_timeout_s: 30, owner: 'test', heartbeat_at: now, last_used_at: now };
};

it('two processes creating at once with one place left: exactly one is admitted, every round', async () => {
  for (let round = 0; round < 15; round++) {
    await pair.writer.kysely.updateTable('sessions').set({ status: 'ended', end_reason: 'closed' }).where('status', '<>', 'ended').execute();
    const seen: number[] = [];
    const admit = (live: number) => {
      seen.push(live);
      if (live >= 1) throw new Error('full');
    };
    const results = await Promise.allSettled([insertSessionAdmitted(pair.listener.kysely, admit, row()), insertSessionAdmitted(pair.writer.kysely, admit, row())]);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    expect(results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason))).toEqual(['Error: full']);
    // The loser counted the winner's session: the counts were taken one after the other.
    expect(seen.sort()).toEqual([0, 1]);
    const live = await pair.writer.kysely.selectFrom('sessions').select('id').where('status', '<>', 'ended').execute();
    expect(live).toHaveLength(1);
  }
});
