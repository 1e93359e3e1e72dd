/**
 * Fencing end to end (issue 20): two services on one PostgreSQL database, A running an async job in a
 * real sandbox. A's heartbeats stall (its holder timers are paused — a CPU-starved replica as others
 * see it). Past A's lease, B's sweep takes the run over (a local run cannot be re-attached: B settles
 * it `internal_error`). When A's timers run again, A learns its run is not its own, kills its sandbox
 * and writes nothing: the record stays as B settled it, and A never even tried to settle it.
 */
import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import type { Logger } from '../../../src/logger.ts';
import { pausableTimers } from '../../support/pausable-timers.ts';
import { freshDatabase, testDbKind, type TestDatabase } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;


function capturingLogger(logged: J[]): Logger {
  return pino({ level: 'info' }, { write: (line: string) => void logged.push(JSON.parse(line) as J) });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const services: TestService[] = [];
let database: TestDatabase | undefined;
afterAll(async () => {
  for (const s of services) await s.close();
  await database?.drop();
});

// Two processes on one database: PostgreSQL only (PGlite is one process's own database).
const kind = await testDbKind();

describe.skipIf(kind !== 'postgres')('a holder stalled past its lease', () => {
  it('is taken over; once it runs again it kills its attempt and settles nothing', async () => {
    database = await freshDatabase();
    const logA: J[] = [];
    const timersA = pausableTimers();
    const cfg = { holder_lease_seconds: 2 };
    const a = await startTestService(cfg, { heartbeatMs: 200, holderTimers: timersA.every, logger: capturingLogger(logA), workerId: 'replica-a/1/a' }, database);
    services.push(a);
    const b = await startTestService({ ...cfg, dispatch: false }, { heartbeatMs: 200 }, database);
    services.push(b);

    const res = await a.post('/execute/async', { code: 'import time\nprint("started", flush=True)\ntime.sleep(8)\nprint("late")' });
    expect(res.status).toBe(202);
    const id = ((await res.json()) as J).job_id as string;
    const row = () => a.db.kysely.selectFrom('executions').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
    for (let t = Date.now(); !((await row()).phase === 'execution' && (await row()).claimed_by === a.executions.workerId); ) {
      if (Date.now() - t > 20_000) throw new Error('the run never reached user code on A');
      await sleep(50);
    }

    // (A names another host: B cannot tell it is alive by its pid, only by its lease.)
    // Stalled for longer than the old rule's five heartbeats (1 s), within the lease: A keeps it.
    timersA.pause();
    await sleep(1500);
    expect((await row()).claimed_by).toBe(a.executions.workerId);
    // Past the lease: B's sweep (every second) takes the run over and settles it.
    for (let t = Date.now(); (await row()).status === 'running'; ) {
      if (Date.now() - t > 10_000) throw new Error('B never took the run over');
      await sleep(100);
    }
    const settled = await row();
    expect(settled).toMatchObject({ status: 'failed' });
    expect(settled.error as J).toMatchObject({ type: 'internal_error' });

    // A runs again: its next heartbeat fences the run, well before the program would have ended.
    const resumedAt = Date.now();
    timersA.resume();
    const mine = () => logA.filter((l) => l.execution_id === id).map((l) => l.msg as string);
    while (!mine().some((m) => m.startsWith('attempt stopped'))) {
      if (Date.now() - resumedAt > 5000) throw new Error(`A never stopped its attempt: ${JSON.stringify(mine())}`);
      await sleep(50);
    }
    expect(Date.now() - resumedAt).toBeLessThan(4000);
    expect(mine()).toContain('run taken over by another process; stopping this attempt without settling it');
    expect(mine()).not.toContain('record was settled elsewhere; result dropped');
    expect(mine()).not.toContain('run finished');
    expect(mine()).not.toContain('job returned to the queue');
    // The record is as B left it.
    const after = await row();
    expect(after.status).toBe('failed');
    expect(after.ended_at).toEqual(settled.ended_at);
    expect(String(after.stdout)).not.toContain('late');
  });
});
