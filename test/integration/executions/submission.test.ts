/**
 * Submission of queued work (src/executions/submission.ts) on a real database, without a service
 * around it: the record a submission writes, idempotency keys (replay, conflict, replay while the
 * queue is full), admission against `max_queue_size` with its cached depth (SPEC §4.2), and rerun and
 * fork (SPEC §4.6, §4.7). The clock is injected, so the depth cache's ages are exact.
 */
import pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../../src/config.ts';
import { AppError } from '../../../src/errors.ts';
import { Submissions } from '../../../src/executions/submission.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import { QueuedNotifier } from '../../../src/queue/channels.ts';
import type { Db, NewExecutionRow } from '../../../src/store/database.ts';
import { testDbKind, type TestDatabase } from '../../support/db.ts';
import { usePairedDatabase } from '../../support/paired-db.ts';

const kind = await testDbKind();

const pair = usePairedDatabase(['executions']);
let database: TestDatabase;
let db: Db;
let other: Db;
beforeAll(() => {
  ({ database, db, other } = pair);
});

const T0 = Date.parse('2026-07-08T09:10:11.000Z');
const META = { correlationId: 'corr-1', clientIp: '192.0.2.9' };

/** A QueuedNotifier that also counts its wake-ups (it still sends them). */
class CountingNotifier extends QueuedNotifier {
  calls = 0;
  override notify(): void {
    this.calls += 1;
    super.notify();
  }
}

function submissions(config: Record<string, unknown> = {}) {
  const cfg = parseConfig({ workspace: database.workspace, log_level: 'silent', ...config }, {});
  const clock = { t: T0, now: () => clock.t };
  const notifier = new CountingNotifier(db);
  const s = new Submissions({ db, registry: new FileJobTypeRegistry(cfg), config: cfg, clock, notifier });
  return { s, clock, notifier };
}

/** Rows as other processes would have queued them (straight into the table). */
async function queueElsewhere(n: number, status = 'queued'): Promise<void> {
  if (n === 0) return;
  const rows: NewExecutionRow[] = Array.from({ length: n }, (_, i) => ({
    id: `elsewhere-${status}-${i}-${Math.random().toString(36).slice(2, 8)}`,
    status,
    mode: 'async',
    job_type: 'default',
    job_version: 'latest',
    job_ref: 'default@latest',
    code: 'print(0)',
    input_data: '{}',
    code_hash: 'h',
    input_hash: 'h',
    timeout_s: 30,
    startup_timeout_s: 60,
    requirements: '[]',
  }));
  await other.kysely.insertInto('executions').values(rows).execute();
}

const job = (code = 'print(1)', extra: Record<string, unknown> = {}) => ({ code, input_data: { a: [1, 2] }, job_type: 'default', ...extra });
const count = async () => (await db.kysely.selectFrom('executions').select('id').execute()).length;

async function rejection(p: Promise<unknown>): Promise<AppError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(AppError);
  return e as AppError;
}

describe('submit without a key', () => {
  it('writes a queued async record at the clock’s time and answers its identity', async () => {
    const { s, clock } = submissions();
    clock.t = T0 + 1234;
    const woken: string[] = [];
    const unlisten = await other.listen('sandpod_queued', (p) => woken.push(p));
    try {
      const { row, created } = await s.submit(job('print("x")', { timeout: 7, requirements: ['requests'] }), META);

      expect(created).toBe(true);
      expect(row).toEqual({ id: row.id, status: 'queued', job_type: 'default', created_at: new Date(T0 + 1234), idempotency_key: null, parent_execution_id: null, relationship: null });
      const stored = await db.kysely.selectFrom('executions').selectAll().where('id', '=', row.id).executeTakeFirstOrThrow();
      expect(stored).toMatchObject({ status: 'queued', mode: 'async', code: 'print("x")', input_data: { a: [1, 2] }, timeout_s: 7, requirements: ['requests'], correlation_id: 'corr-1', client_ip: '192.0.2.9', attempts: 0 });
      expect(new Date(stored.created_at).getTime()).toBe(T0 + 1234);
      // The inserting statement itself wakes the dispatchers.
      const end = Date.now() + 5000;
      while (woken.length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      expect(woken.length).toBeGreaterThan(0);
    } finally {
      await unlisten();
    }
  });

  it('concurrent submissions each get their own record', async () => {
    const { s } = submissions();
    const res = await Promise.all(Array.from({ length: 6 }, (_, i) => s.submit(job(`print(${i})`), META)));
    expect(new Set(res.map((r) => r.row.id)).size).toBe(6);
    const codes = (await db.kysely.selectFrom('executions').select(['id', 'code']).execute()).map((r) => [r.id, r.code]);
    expect(codes.sort()).toEqual(res.map((r, i) => [r.row.id, `print(${i})`]).sort());
  });
});

describe('submit with an idempotency key', () => {
  it('creates once and wakes the dispatchers; the same payload again answers that job, created: false, waking nobody', async () => {
    const { s, notifier } = submissions();
    const first = await s.submit(job('print(1)', { idempotency_key: 'k1' }), META);
    expect(first.created).toBe(true);
    expect(first.row).toMatchObject({ status: 'queued', idempotency_key: 'k1' });
    expect(notifier.calls).toBe(1);

    const again = await s.submit(job('print(1)', { idempotency_key: 'k1' }), { correlationId: 'corr-2', clientIp: null });

    expect(again.created).toBe(false);
    expect(again.row.id).toBe(first.row.id);
    expect(notifier.calls).toBe(1);
    expect(await count()).toBe(1);
  });

  it('another payload under a known key is a 409 naming the key and the existing job', async () => {
    const { s } = submissions();
    const first = await s.submit(job('print(1)', { idempotency_key: 'k2' }), META);
    const err = await rejection(s.submit(job('print(2)', { idempotency_key: 'k2' }), META));
    expect(err.code).toBe('idempotency_conflict');
    expect(err.message).toBe("idempotency_key 'k2' was already used with a different payload");
    expect(err.extra).toEqual({ existing_job_id: first.row.id });
    expect(await count()).toBe(1);
  });

  it('a replay of a known key answers its job even when the queue is full; a new key there is refused', async () => {
    const { s } = submissions({ max_queue_size: 1 });
    const first = await s.submit(job('print(1)', { idempotency_key: 'k3' }), META);
    const again = await s.submit(job('print(1)', { idempotency_key: 'k3' }), META);
    expect(again).toMatchObject({ created: false, row: { id: first.row.id } });
    expect((await rejection(s.submit(job('print(1)', { idempotency_key: 'k4' }), META))).code).toBe('queue_full');
  });
});

// Two first submissions racing with one key: the loser's look-up found nothing (the winner's insert
// was not committed yet), so the insert settles it. Forced on PostgreSQL by holding the winner's
// insert open in another transaction.
describe.skipIf(kind !== 'postgres')('a key that appears only after the look-up (PostgreSQL)', () => {
  async function race(theirHash: (mine: string) => string) {
    const { s, notifier } = submissions();
    const key = `late-${Math.random().toString(36).slice(2)}`;
    const mineJob = job('print("mine")', { idempotency_key: key });
    // What my payload hashes to: submit it once under another key and read it back.
    const probe = await s.submit(job('print("mine")', { idempotency_key: `${key}-probe` }), META);
    const myHash = (await db.kysely.selectFrom('executions').select('payload_hash').where('id', '=', probe.row.id).executeTakeFirstOrThrow()).payload_hash!;
    const c = new pg.Client({ connectionString: database.url! });
    await c.connect();
    try {
      await c.query('BEGIN');
      await c.query(
        `INSERT INTO executions (id, status, mode, job_type, job_version, job_ref, code, input_data, code_hash, input_hash,
                                 timeout_s, startup_timeout_s, requirements, idempotency_key, payload_hash)
         VALUES ('late-winner', 'queued', 'async', 'default', 'latest', 'default@latest', 'print("theirs")', '{}', 'h', 'h', 30, 60, '[]', $1, $2)`,
        [key, theirHash(myHash)],
      );
      const calls = notifier.calls;
      let settled = false;
      const mine = s
        .submit(mineJob, META)
        .then(
          (v) => ({ ok: true as const, v }),
          (e: unknown) => ({ ok: false as const, e }),
        )
        .finally(() => (settled = true));
      await new Promise((r) => setTimeout(r, 300));
      // Still waiting on the key at the insert: the look-up before it found nothing.
      expect(settled).toBe(false);
      await c.query('COMMIT');
      const out = await mine;
      const rows = await db.kysely.selectFrom('executions').select(['id']).where('idempotency_key', '=', key).execute();
      return { out, rows, woke: notifier.calls - calls };
    } finally {
      await c.query('ROLLBACK').catch(() => {});
      await c.end();
    }
  }

  it('another payload: a 409 naming the job that won, nothing of mine written', async () => {
    const { out, rows, woke } = await race(() => 'their-payload');
    expect(out.ok).toBe(false);
    expect((out as { e: unknown }).e).toMatchObject({ code: 'idempotency_conflict', extra: { existing_job_id: 'late-winner' } });
    expect(rows).toEqual([{ id: 'late-winner' }]);
    expect(woke).toBe(0);
  });

  it('the same payload: the job that won, created: false', async () => {
    const { out, rows, woke } = await race((mine) => mine);
    expect(out).toMatchObject({ ok: true, v: { created: false, row: { id: 'late-winner' } } });
    expect(rows).toEqual([{ id: 'late-winner' }]);
    expect(woke).toBe(0);
  });
});

describe('admission against max_queue_size', () => {
  it('refuses with queue_full naming the counts once queued and running jobs reach the bound', async () => {
    const { s } = submissions({ max_queue_size: 5 });
    await queueElsewhere(1, 'running');
    await queueElsewhere(1, 'succeeded'); // finished jobs take no room
    for (let i = 0; i < 4; i++) await s.submit(job(`print(${i})`), META);

    const err = await rejection(s.submit(job('print("one too many")'), META));

    expect(err.code).toBe('queue_full');
    expect(err.message).toBe('queue is full: 4 queued and 1 running jobs (max_queue_size 5); retry later');
    expect(err.extra).toEqual({ queued: 4, running: 1, max_queue_size: 5 });
    expect(await count()).toBe(6);
  });

  it('every submission counts: jobs queued by other processes in between are seen at once', async () => {
    const { s } = submissions({ max_queue_size: 200 });
    await queueElsewhere(150);
    await s.submit(job(), META); // 151
    await queueElsewhere(49); // 200 now
    expect((await rejection(s.submit(job(), META))).code).toBe('queue_full');
    expect((await rejection(s.submit(job('print(1)', { idempotency_key: 'full-1' }), META))).code).toBe('queue_full');
    expect(await count()).toBe(200);
  });

  it('concurrent submissions through two processes\' connections: exactly the bound is admitted', async () => {
    // Two Submissions on two pools (two processes' worth on PostgreSQL; one handle on PGlite), with
    // and without keys, all at once: the count and the insert must be one atomic step.
    const a = submissions({ max_queue_size: 20 }).s;
    const cfg = parseConfig({ workspace: database.workspace, log_level: 'silent', max_queue_size: 20 }, {});
    const b = new Submissions({ db: other, registry: new FileJobTypeRegistry(cfg), config: cfg, clock: { now: () => T0 }, notifier: new QueuedNotifier(other) });
    await queueElsewhere(3, 'running');
    const out = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        (i % 2 ? a : b).submit(job(`print(${i})`, i % 3 === 0 ? { idempotency_key: `c-${i}` } : {}), META).then(
          () => 'ok',
          (e: unknown) => (e instanceof AppError ? e.code : String(e)),
        ),
      ),
    );
    expect(out.filter((o) => o === 'ok')).toHaveLength(17);
    expect(out.filter((o) => o !== 'ok')).toEqual(Array(183).fill('queue_full'));
    expect(await count()).toBe(20);
  });
});

describe('rerun and fork', () => {
  async function finished(status = 'succeeded'): Promise<string> {
    const { s } = submissions();
    const { row } = await s.submit(job('print("parent")', { timeout: 9, startup_timeout: 33, requirements: ['numpy>=1.26'] }), META);
    await db.kysely.updateTable('executions').set({ status }).where('id', '=', row.id).execute();
    return row.id;
  }

  it('rerun queues the same code, input, job type and settings, linked to its parent', async () => {
    const parent = await finished('failed');
    const { s } = submissions();

    const child = await s.rerun(parent, { correlationId: 'corr-rerun', clientIp: null });

    expect(child).toMatchObject({ status: 'queued', job_type: 'default', parent_execution_id: parent, relationship: 'rerun', idempotency_key: null });
    const rec = await db.kysely.selectFrom('executions').selectAll().where('id', '=', child.id).executeTakeFirstOrThrow();
    expect(rec).toMatchObject({
      code: 'print("parent")',
      input_data: { a: [1, 2] },
      timeout_s: 9,
      startup_timeout_s: 33,
      requirements: ['numpy>=1.26'],
      job_type: 'default',
      parent_execution_id: parent,
      relationship: 'rerun',
      correlation_id: 'corr-rerun',
    });
  });

  it('fork queues new code with the parent’s input, job type and settings', async () => {
    const parent = await finished('timeout');
    const { s } = submissions();

    const child = await s.fork(parent, 'print("child")', META);

    expect(child).toMatchObject({ parent_execution_id: parent, relationship: 'fork' });
    const rec = await db.kysely.selectFrom('executions').selectAll().where('id', '=', child.id).executeTakeFirstOrThrow();
    expect(rec).toMatchObject({ code: 'print("child")', input_data: { a: [1, 2] }, timeout_s: 9, startup_timeout_s: 33, requirements: ['numpy>=1.26'] });
  });

  it.each(['queued', 'running'])('a %s parent is a 409 naming its status', async (status) => {
    const parent = await finished(status);
    const { s } = submissions();
    const r = await rejection(s.rerun(parent, META));
    expect([r.code, r.message, r.extra]).toEqual(['conflict', `job '${parent}' is ${status}; only a finished job can be used for a rerun`, { status }]);
    const f = await rejection(s.fork(parent, 'print(2)', META));
    expect(f.message).toBe(`job '${parent}' is ${status}; only a finished job can be used for a fork`);
  });

  it('an unknown parent is a 404', async () => {
    const { s } = submissions();
    const err = await rejection(s.rerun('no-such-job', META));
    expect([err.code, err.message]).toEqual(['not_found', "job 'no-such-job' not found"]);
    expect((await rejection(s.fork('no-such-job', 'x', META))).code).toBe('not_found');
  });
});
