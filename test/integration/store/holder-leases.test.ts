/**
 * Liveness of holders across processes on real PostgreSQL (issue 20, "no double claims"): two
 * Holders on one database, each with its own pool, as two replicas. A's heartbeats stall (its timers
 * are paused: what a CPU-starved or frozen replica looks like from outside) for longer than the old
 * rule's five heartbeats but within its lease: B takes nothing. Past the lease B takes the run over,
 * and A, once it runs again, learns it at its next heartbeat and stops its attempt (reason `fenced`).
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/logger.ts';
import { Holders, SWEEP_HEARTBEATS } from '../../../src/queue/holders.ts';
import { pausableTimers } from '../../support/pausable-timers.ts';
import { createDb, type Db, type ExecutionRow } from '../../../src/store/database.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { orphanRow } from '../../support/rows.ts';

const HEARTBEAT_MS = 100;
const LEASE_MS = 1500;


const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let database: TestDatabase;
let dbA: Db;
let dbB: Db;
beforeAll(async () => {
  database = await freshDatabase();
  dbA = await createDb({ url: database.url, workspace: database.workspace });
  await migrateToLatest(dbA.kysely);
  dbB = database.url ? await createDb({ url: database.url, workspace: database.workspace }) : dbA;
});
// Each test starts with no running records (a stopped holder's runs are anyone's at the next sweep).
beforeEach(async () => {
  await dbA.kysely.deleteFrom('executions').execute();
});
afterAll(async () => {
  if (dbB !== dbA) await dbB.destroy();
  await dbA.destroy();
  await database.drop();
});

describe('holder leases (two holders, one database)', () => {
  it('a stalled holder keeps its run within its lease; past it the run is taken over and the stalled holder fences itself', async () => {
    const timersA = pausableTimers();
    const a = new Holders({ db: dbA, workerId: 'replica-a/1/a', clock: { now: () => Date.now() }, logger: silentLogger, heartbeatMs: HEARTBEAT_MS, leaseMs: LEASE_MS, every: timersA.every, onAdopted: async (r) => r });
    const adoptedByB: ExecutionRow[] = [];
    const b = new Holders({
      db: dbB,
      workerId: 'replica-b/1/b',
      clock: { now: () => Date.now() },
      logger: silentLogger,
      heartbeatMs: HEARTBEAT_MS,
      leaseMs: LEASE_MS,
      onAdopted: async (r) => {
        adoptedByB.push(r);
        return r;
      },
    });
    await a.start();
    await b.start();
    try {
      const id = `lease-${Date.now()}`;
      await dbA.kysely.insertInto('executions').values(orphanRow(id, 'execution', 'print(1)', 'replica-a/1/a')).execute();
      const signal = a.hold(id);
      const holder = async () => (await dbB.kysely.selectFrom('executions').select('claimed_by').where('id', '=', id).executeTakeFirstOrThrow()).claimed_by;

      // Stalled longer than the old rule's window (five heartbeats) but within the lease: B's sweeps
      // (every five heartbeats, and one more by hand) take nothing.
      timersA.pause();
      await sleep(HEARTBEAT_MS * SWEEP_HEARTBEATS * 2 + 200);
      expect(await b.recoverOrphans()).toHaveLength(0);
      expect(adoptedByB).toHaveLength(0);
      expect(await holder()).toBe('replica-a/1/a');
      timersA.resume();
      // Its heartbeats resume and keep the run; the attempt goes on.
      await sleep(HEARTBEAT_MS * 3);
      expect(signal.aborted).toBe(false);
      expect(await a.confirmHeld(id)).toBe(true);

      // Stalled past the lease: B takes the run over (its own sweep or this one, whichever comes first).
      timersA.pause();
      await sleep(LEASE_MS + 300);
      await b.recoverOrphans();
      expect(adoptedByB.map((r) => r.id)).toEqual([id]);
      expect(await holder()).toBe('replica-b/1/b');
      // A has not run since: it does not know yet.
      expect(signal.aborted).toBe(false);
      // Before starting anything it asks; the answer is no, and the attempt is stopped as fenced.
      expect(await a.confirmHeld(id)).toBe(false);
      expect(signal.aborted).toBe(true);
      expect(signal.reason).toBe('fenced');
      timersA.resume();
      // The record stays B's: A's heartbeats no longer touch it.
      await sleep(HEARTBEAT_MS * 3);
      expect(await holder()).toBe('replica-b/1/b');
    } finally {
      await a.stop();
      await b.stop();
    }
  });

  it('a holder whose timers resume after the takeover fences the run at its next heartbeat', async () => {
    const timersA = pausableTimers();
    const a = new Holders({ db: dbA, workerId: 'replica-c/1/c', clock: { now: () => Date.now() }, logger: silentLogger, heartbeatMs: HEARTBEAT_MS, leaseMs: LEASE_MS, every: timersA.every, onAdopted: async (r) => r });
    const b = new Holders({ db: dbB, workerId: 'replica-d/1/d', clock: { now: () => Date.now() }, logger: silentLogger, heartbeatMs: 60_000, leaseMs: LEASE_MS, onAdopted: async (r) => r });
    await a.start();
    await b.start();
    try {
      const id = `lease-beat-${Date.now()}`;
      await dbA.kysely.insertInto('executions').values(orphanRow(id, 'execution', 'print(1)', 'replica-c/1/c')).execute();
      const signal = a.hold(id);
      timersA.pause();
      await sleep(LEASE_MS + 300);
      expect(await b.recoverOrphans()).toHaveLength(1);
      timersA.resume();
      const deadline = Date.now() + 3000;
      while (!signal.aborted && Date.now() < deadline) await sleep(20);
      expect(signal.reason).toBe('fenced');
    } finally {
      await a.stop();
      await b.stop();
    }
  });

  it('a run this process is settling itself is not fenced when its record leaves `running`', async () => {
    const a = new Holders({ db: dbA, workerId: 'replica-e/1/e', clock: { now: () => Date.now() }, logger: silentLogger, heartbeatMs: HEARTBEAT_MS, leaseMs: LEASE_MS, onAdopted: async (r) => r });
    await a.start();
    try {
      const id = `lease-own-${Date.now()}`;
      await dbA.kysely.insertInto('executions').values(orphanRow(id, 'execution', 'print(1)', 'replica-e/1/e')).execute();
      const signal = a.hold(id);
      a.finishing(id);
      await dbA.kysely.updateTable('executions').set({ status: 'succeeded', claimed_by: null }).where('id', '=', id).execute();
      await sleep(HEARTBEAT_MS * 4);
      expect(signal.aborted).toBe(false);
    } finally {
      await a.stop();
    }
  });

  it('a clean stop ends the lease at once: what the process left running is taken at the next sweep', async () => {
    const a = new Holders({ db: dbA, workerId: 'replica-f/1/f', clock: { now: () => Date.now() }, logger: silentLogger, heartbeatMs: HEARTBEAT_MS, leaseMs: 60_000, onAdopted: async (r) => r });
    const b = new Holders({ db: dbB, workerId: 'replica-g/1/g', clock: { now: () => Date.now() }, logger: silentLogger, heartbeatMs: 60_000, leaseMs: 60_000, onAdopted: async (r) => r });
    await a.start();
    await b.start();
    try {
      const id = `lease-stop-${Date.now()}`;
      await dbA.kysely.insertInto('executions').values(orphanRow(id, 'execution', 'print(1)', 'replica-f/1/f')).execute();
      expect(await b.recoverOrphans()).toHaveLength(0);
      await a.stop();
      expect(await b.recoverOrphans()).toHaveLength(1);
    } finally {
      await b.stop();
    }
  });

  it('a holder that cannot reach the database is not fenced: confirmHeld throws (the attempt is retried), the run stays held', async () => {
    if (!database.url) return; // PGlite: one handle per directory, which this test cannot take away
    const own = await createDb({ url: database.url, workspace: database.workspace });
    const a = new Holders({ db: own, workerId: 'replica-h/1/h', clock: { now: () => Date.now() }, logger: silentLogger, heartbeatMs: 60_000, leaseMs: 300, onAdopted: async (r) => r });
    await a.start();
    const id = `lease-down-${Date.now()}`;
    await dbA.kysely.insertInto('executions').values(orphanRow(id, 'execution', 'print(1)', 'replica-h/1/h')).execute();
    const signal = a.hold(id);
    expect(await a.confirmHeld(id)).toBe(true);
    await own.destroy();
    await sleep(350);
    await expect(a.confirmHeld(id)).rejects.toThrow(/could not confirm/);
    expect(signal.aborted).toBe(false);
    await a.stop();
  });
});
