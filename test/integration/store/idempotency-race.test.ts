/**
 * Issue #9 (a): two first submissions racing with one idempotency key and different payloads. The
 * loser must get the 409 naming the winner — never the winner's job as if it were its own. The payload
 * check on the insert-conflict path (the key was not visible yet when the loser looked) is forced
 * deterministically on PostgreSQL by holding the winner's insert open in another transaction.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.ts';
import { testDbKind } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
const kind = await testDbKind();

let svc: TestService;
beforeAll(async () => {
  // No dispatch: the records stay as submitted, and nothing runs.
  svc = await startTestService({ dispatch: false, max_queue_size: 1000 });
});
afterAll(async () => {
  await svc?.close();
});

describe('racing first submissions with one key', () => {
  it('different payloads: one 202, one 409 whose existing_job_id is the winner, whose record has its own code', async () => {
    for (let i = 0; i < 15; i++) {
      const key = `race-${i}-${Date.now()}`;
      const bodies = [
        { code: `print("a${i}")`, idempotency_key: key },
        { code: `print("b${i}")`, idempotency_key: key },
      ];
      const res = await Promise.all(bodies.map((b) => svc.post('/execute/async', b)));
      const statuses = res.map((r) => r.status).sort();
      expect(statuses).toEqual([202, 409]);
      const winner = res.findIndex((r) => r.status === 202);
      const won = (await res[winner]!.json()) as J;
      const lost = (await res[1 - winner]!.json()) as J;
      expect(lost).toMatchObject({ code: 'idempotency_conflict', existing_job_id: won.job_id });
      const rec = await svc.db.kysely.selectFrom('executions').select(['code']).where('id', '=', won.job_id).executeTakeFirstOrThrow();
      expect(rec.code).toBe(bodies[winner]!.code);
    }
  });

  it('same payload: both answer the one job', async () => {
    const body = { code: 'print("same")', idempotency_key: `same-${Date.now()}` };
    const [a, b] = await Promise.all([svc.executions.submitAsync({ ...body, input_data: {}, job_type: 'default' }, meta()), svc.executions.submitAsync({ ...body, input_data: {}, job_type: 'default' }, meta())]);
    expect(a.row.id).toBe(b.row.id);
    expect([a.created, b.created].sort()).toEqual([false, true]);
  });
});

describe.skipIf(kind !== 'postgres')('the insert-conflict path (PostgreSQL)', () => {
  it('a key that appears only after the look-up, with another payload, is a 409 naming that job', async () => {
    const key = `late-${Date.now()}`;
    const other = new pg.Client({ connectionString: svc.database.url! });
    await other.connect();
    try {
      await other.query('BEGIN');
      await other.query(
        `INSERT INTO executions (id, status, mode, job_type, job_version, job_ref, code, input_data, code_hash, input_hash,
                                 timeout_s, startup_timeout_s, requirements, idempotency_key, payload_hash)
         VALUES ('late-winner', 'queued', 'async', 'default', 'latest', 'default@sha256:0', 'print("theirs")', '{}', 'h', 'h', 30, 60, '[]', $1, 'their-payload')`,
        [key],
      );
      // The uncommitted row is invisible to the look-up, so this submission reaches the insert and waits on the key.
      let settled = false;
      const mine = svc.executions
        .submitAsync({ code: 'print("mine")', input_data: {}, job_type: 'default', idempotency_key: key }, meta())
        .then(
          (v) => ({ ok: true as const, v }),
          (e: unknown) => ({ ok: false as const, e }),
        )
        .finally(() => (settled = true));
      await new Promise((r) => setTimeout(r, 500));
      expect(settled).toBe(false);
      await other.query('COMMIT');
      const out = await mine;
      expect(out.ok).toBe(false);
      const err = (out as { e: unknown }).e;
      expect(err).toBeInstanceOf(AppError);
      expect(err).toMatchObject({ code: 'idempotency_conflict', extra: { existing_job_id: 'late-winner' } });
      // Nothing of mine was written.
      const rows = await svc.db.kysely.selectFrom('executions').select(['id', 'code']).where('idempotency_key', '=', key).execute();
      expect(rows).toEqual([{ id: 'late-winner', code: 'print("theirs")' }]);
    } finally {
      await other.query('ROLLBACK').catch(() => {});
      await other.end();
    }
  });
});

function meta() {
  return { correlationId: 'test', clientIp: null };
}
