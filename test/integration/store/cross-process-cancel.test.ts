/**
 * Issue #9 (b): a cancel reaches a run held by another process by each of its two paths alone.
 * Two services share one PostgreSQL database, as two replicas do: A takes the cancel, B holds the run
 * (A does not dispatch). NOTIFY alone: heartbeats far slower than the test, so only the notification
 * can stop the run in time. Heartbeat alone: B's database handle never delivers the cancel channel
 * (a listener connection that dropped), so only the flag its heartbeat reads back can.
 * PostgreSQL only: PGlite is one process's database.
 */
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { CANCEL_CHANNEL } from '../../../src/queue/channels.ts';
import { createDb, type Db } from '../../../src/store/database.ts';
import { freshDatabase, testDbKind, type TestDatabase } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const kind = await testDbKind();
const LONG = 'import time\nprint("started", flush=True)\ntime.sleep(60)';

describe.skipIf(kind !== 'postgres')('cancel across processes', () => {
  let database: TestDatabase;
  let services: TestService[] = [];
  beforeAll(async () => {
    database = await freshDatabase();
  });
  // Each test's services go before the next test starts (a dispatcher left running would claim its job).
  afterEach(async () => {
    for (const s of services) await s.close();
    services = [];
  });
  afterAll(async () => {
    await database?.drop();
  });

  function onWorkspace(name: string): TestDatabase {
    const workspace = path.join(database.workspace, name);
    mkdirSync(workspace, { recursive: true, mode: 0o755 });
    return { ...database, workspace, drop: async () => {} };
  }

  /** A submits a long job; B (the only dispatcher) runs it; resolves once its user code runs in B. */
  async function heldByB(a: TestService, b: TestService): Promise<string> {
    const { row } = await a.executions.submitAsync({ code: LONG, input_data: {}, job_type: 'default', timeout: 90 }, { correlationId: 'x', clientIp: null });
    const end = Date.now() + 30_000;
    for (;;) {
      const r = await a.db.kysely.selectFrom('executions').select(['status', 'claimed_by', 'phase', 'error']).where('id', '=', row.id).executeTakeFirstOrThrow();
      if (r.status === 'running' && r.claimed_by === b.executions.workerId && r.phase === 'execution') return row.id;
      if (Date.now() > end) throw new Error(`job never ran in B: ${JSON.stringify(r)}`);
      await new Promise((res) => setTimeout(res, 50));
    }
  }

  /** Cancels from A and measures how long until the record is settled. */
  async function cancelFromA(a: TestService, id: string, withinMs: number): Promise<{ status: string; ms: number }> {
    const t0 = Date.now();
    await a.executions.cancel(id, 0);
    for (;;) {
      const r = await a.db.kysely.selectFrom('executions').select(['status']).where('id', '=', id).executeTakeFirstOrThrow();
      if (r.status !== 'running' || Date.now() - t0 > withinMs) return { status: r.status, ms: Date.now() - t0 };
      await new Promise((res) => setTimeout(res, 50));
    }
  }

  it('by NOTIFY alone (no heartbeat within the test)', async () => {
    const slow = { heartbeatMs: 120_000 };
    const a = await startTestService({ dispatch: false }, slow, onWorkspace('notify-a'));
    services.push(a);
    const b = await startTestService({ max_workers: 1 }, slow, onWorkspace('notify-b'));
    services.push(b);
    const id = await heldByB(a, b);
    const out = await cancelFromA(a, id, 15_000);
    expect(out.status).toBe('cancelled');
    expect(out.ms).toBeLessThan(10_000);
  });

  it('by the heartbeat alone (the holder never hears the NOTIFY)', async () => {
    const hb = { heartbeatMs: 300 };
    // A's sweep must not run: both services live in this one process, and a holder with this pid and
    // another nonce reads as this process's previous life, i.e. dead (one service per process in real use).
    const a = await startTestService({ dispatch: false }, { heartbeatMs: 120_000 }, onWorkspace('beat-a'));
    services.push(a);
    const ws = onWorkspace('beat-b');
    const real = await createDb({ url: ws.url, workspace: ws.workspace });
    let dropped = 0;
    const deaf: Db = {
      ...real,
      listen: (channel, onPayload) =>
        channel === CANCEL_CHANNEL
          ? Promise.resolve(async () => {})
          : real.listen(channel, onPayload),
    };
    // Count what B would have heard, to show the notification was sent and ignored.
    const spy = await real.listen(CANCEL_CHANNEL, () => dropped++);
    const b = await startTestService({ max_workers: 1 }, { ...hb, db: deaf }, ws);
    services.push(b);
    const id = await heldByB(a, b);
    const out = await cancelFromA(a, id, 15_000);
    await spy();
    expect(dropped).toBe(1);
    expect(out.status).toBe('cancelled');
    expect(out.ms).toBeLessThan(10_000);
  });
});
