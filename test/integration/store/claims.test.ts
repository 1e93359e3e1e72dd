/**
 * Claims on the durable queue (src/queue/claims.ts), against a real database: which record a claim
 * takes and what it writes, that concurrent claimers never take one record twice, and that giving a
 * record back restores it exactly as if never started — only for the process that holds it.
 */
import pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import { Claims, claimNext, unclaim } from '../../../src/queue/claims.ts';
import { QueuedNotifier } from '../../../src/queue/channels.ts';
import type { Db, ExecutionRow, NewExecutionRow } from '../../../src/store/database.ts';
import { testDbKind, type TestDatabase } from '../../support/db.ts';
import { newRow } from '../../support/rows.ts';
import { usePairedDatabase } from '../../support/paired-db.ts';

const kind = await testDbKind();
const pair = usePairedDatabase(['executions']);
let database: TestDatabase;
let db: Db;
let other: Db;
beforeAll(() => {
  ({ database, db, other } = pair);
});

const T0 = new Date('2026-03-04T05:06:07.000Z');

function queued(id: string, createdAt: Date, extra: Partial<NewExecutionRow> = {}): NewExecutionRow {
  return newRow(id, { created_at: createdAt, attempts: 0, ...extra });
}

const at = (ms: number) => new Date(T0.getTime() + ms);
const read = (id: string) => db.kysely.selectFrom('executions').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
const statuses = async () =>
  Object.fromEntries((await db.kysely.selectFrom('executions').select(['id', 'status', 'claimed_by']).orderBy('id').execute()).map((r) => [r.id, [r.status, r.claimed_by]]));

/** A QueuedNotifier that also counts its wake-ups (it still sends them). */
class CountingNotifier extends QueuedNotifier {
  calls = 0;
  override notify(): void {
    this.calls += 1;
    super.notify();
  }
}

describe('claimNext', () => {
  it('finds nothing in an empty queue, nor among records that are not queued', async () => {
    expect(await claimNext(db.kysely, 'w1', T0)).toBeUndefined();
    await db.kysely
      .insertInto('executions')
      .values([queued('r', at(0), { status: 'running', claimed_by: 'w0' }), queued('s', at(1), { status: 'succeeded' }), queued('c', at(2), { status: 'cancelled' })])
      .execute();
    expect(await claimNext(db.kysely, 'w1', T0)).toBeUndefined();
    expect(await statuses()).toEqual({ c: ['cancelled', null], r: ['running', 'w0'], s: ['succeeded', null] });
  });

  it('takes the oldest queued record, and writes running, holder, times, phase and one more attempt', async () => {
    await db.kysely
      .insertInto('executions')
      .values([queued('newer', at(20)), queued('oldest', at(10), { attempts: 2 }), queued('done-older', at(0), { status: 'failed' })])
      .execute();
    const now = at(1000);

    const got = await claimNext(db.kysely, 'worker-a', now);

    expect(got).toMatchObject({ id: 'oldest', status: 'running', claimed_by: 'worker-a', phase: 'startup', attempts: 3 });
    expect(new Date(got!.started_at!).toISOString()).toBe(now.toISOString());
    expect(new Date(got!.heartbeat_at!).toISOString()).toBe(now.toISOString());
    // What it returns is what it stored; nothing else moved.
    expect(await read('oldest')).toEqual(got);
    expect(await statuses()).toEqual({ 'done-older': ['failed', null], newer: ['queued', null], oldest: ['running', 'worker-a'] });
  });

  it('breaks a tie in creation time by id, and goes on in queue order', async () => {
    await db.kysely.insertInto('executions').values([queued('b', at(5)), queued('c', at(5)), queued('a', at(5)), queued('z', at(1))]).execute();
    const order: string[] = [];
    for (;;) {
      const r = await claimNext(db.kysely, 'w', T0);
      if (!r) break;
      order.push(r.id);
    }
    expect(order).toEqual(['z', 'a', 'b', 'c']);
  });

  it('two processes claiming at once never take one record twice', async () => {
    const ids = Array.from({ length: 12 }, (_, i) => `q-${String(i).padStart(2, '0')}`);
    await db.kysely.insertInto('executions').values(ids.map((id, i) => queued(id, at(i)))).execute();
    const claimer = (h: Db, w: string) => async () => {
      const mine: string[] = [];
      for (let r = await claimNext(h.kysely, w, T0); r; r = await claimNext(h.kysely, w, T0)) mine.push(r.id);
      return mine;
    };

    const [a, b] = await Promise.all([claimer(db, 'A')(), claimer(other, 'B')()]);

    expect([...a, ...b].sort()).toEqual(ids);
    const rows = await db.kysely.selectFrom('executions').select(['id', 'claimed_by', 'attempts']).execute();
    for (const r of rows) expect([r.claimed_by === 'A' ? a.includes(r.id) : b.includes(r.id), r.attempts]).toEqual([true, 1]);
  });

  it.skipIf(kind !== 'postgres')('skips a record another transaction holds locked instead of waiting for it (PostgreSQL)', async () => {
    await db.kysely.insertInto('executions').values([queued('locked', at(0)), queued('free', at(1))]).execute();
    const c = new pg.Client({ connectionString: database.url! });
    await c.connect();
    try {
      await c.query('BEGIN');
      await c.query(`SELECT id FROM executions WHERE id = 'locked' FOR UPDATE`);

      const got = await claimNext(db.kysely, 'w', T0);

      expect(got?.id).toBe('free');
      expect(await claimNext(db.kysely, 'w', T0)).toBeUndefined();
      await c.query('COMMIT');
      expect((await claimNext(db.kysely, 'w', T0))?.id).toBe('locked');
    } finally {
      await c.query('ROLLBACK').catch(() => {});
      await c.end();
    }
  });
});

describe('unclaim', () => {
  it('puts a record its holder gives back in the queue as if never started; the attempt count stays', async () => {
    await db.kysely.insertInto('executions').values([queued('j', at(0), { attempts: 1 }), queued('k', at(1))]).execute();
    const claimed = await claimNext(db.kysely, 'w1', at(50));
    expect(claimed?.id).toBe('j');

    const back = await unclaim(db.kysely, 'j', 'w1');

    expect(back).toMatchObject({ id: 'j', status: 'queued', claimed_by: null, started_at: null, heartbeat_at: null, phase: null, attempts: 2 });
    expect(await read('j')).toEqual(back);
    // It is first in line again.
    expect((await claimNext(db.kysely, 'w2', at(60)))?.id).toBe('j');
  });

  it('leaves a record held by another process, or no longer running, alone', async () => {
    await db.kysely
      .insertInto('executions')
      .values([queued('theirs', at(0), { status: 'running', claimed_by: 'w2', phase: 'execution', started_at: T0 }), queued('settled', at(1), { status: 'succeeded', claimed_by: 'w1' })])
      .execute();
    const before = [await read('theirs'), await read('settled')];

    expect(await unclaim(db.kysely, 'theirs', 'w1')).toBeUndefined();
    expect(await unclaim(db.kysely, 'settled', 'w1')).toBeUndefined();
    expect(await unclaim(db.kysely, 'missing', 'w1')).toBeUndefined();
    expect([await read('theirs'), await read('settled')]).toEqual(before);
  });
});

describe('Claims', () => {
  function claims(workerId: string, nowMs: number): { c: Claims; notifier: CountingNotifier } {
    const notifier = new CountingNotifier(db);
    return { c: new Claims({ db, workerId, clock: { now: () => nowMs }, notifier }), notifier };
  }

  it('claim() takes the oldest job for this process at the clock’s time', async () => {
    await db.kysely.insertInto('executions').values([queued('second', at(2)), queued('first', at(1))]).execute();
    const { c } = claims('proc-1', at(5000).getTime());

    const r = await c.claim();

    expect(r).toMatchObject({ id: 'first', status: 'running', claimed_by: 'proc-1' });
    expect(new Date(r!.started_at!).toISOString()).toBe(at(5000).toISOString());
  });

  it('giveBack() returns the queued record and wakes the dispatchers', async () => {
    await db.kysely.insertInto('executions').values(queued('g', at(0))).execute();
    const { c, notifier } = claims('proc-1', T0.getTime());
    const held = (await c.claim()) as ExecutionRow;
    const woken: string[] = [];
    const unlisten = await other.listen('sandpod_queued', (p) => woken.push(p));
    try {
      const back = await c.giveBack(held);

      expect(back).toMatchObject({ id: 'g', status: 'queued', claimed_by: null, attempts: 1 });
      expect(notifier.calls).toBe(1);
      const end = Date.now() + 5000;
      while (woken.length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      expect(woken).toEqual(['']);
    } finally {
      await unlisten();
    }
  });

  it('giveBack() of a job that is not ours any more answers the record as given, writes nothing and wakes nobody', async () => {
    await db.kysely.insertInto('executions').values(queued('h', at(0))).execute();
    const mine = claims('proc-1', T0.getTime());
    const held = (await mine.c.claim()) as ExecutionRow;
    // Another process adopted it meanwhile.
    await db.kysely.updateTable('executions').set({ claimed_by: 'proc-2' }).where('id', '=', 'h').execute();

    const answer = await mine.c.giveBack(held);

    expect(answer).toBe(held);
    expect(mine.notifier.calls).toBe(0);
    expect(await read('h')).toMatchObject({ status: 'running', claimed_by: 'proc-2' });
  });
});
