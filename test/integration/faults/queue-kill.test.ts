/**
 * 50 async jobs across a `kill -9` of the service (issue 22, "What must hold"): a service process is
 * killed while it serves the queue and a new one starts on the same database and workspace. Every job
 * ends once and correctly. A job whose code was not running at the kill ends `succeeded` with its own
 * output — those claimed but still starting go back to the queue. A job whose code was running at the
 * kill cannot be finished without running it again, which it must not be (it may have had effects):
 * it ends `failed` with `internal_error` saying so, and it is one of the kill's runs in flight (at
 * most `max_workers`). No job's code started twice (its `running` phase is recorded once).
 * PostgreSQL only: two processes share the database.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { testDbKind } from '../../support/db.ts';
import { httpClient, settledBatch, submitBatch, untilSucceeded, wrongSuccess } from '../../support/job-batch.ts';
import { useServiceProcesses } from '../../support/service-processes.ts';

const kind = await testDbKind();

describe.skipIf(kind !== 'postgres')('50 queued jobs across a kill -9', () => {
  const services = useServiceProcesses();
  let base = '';
  const client = httpClient(() => base);

  it('each job ends once: succeeded with its output, or (code running at the kill) failed without a second run', async () => {
    const cfg = { max_workers: 3, max_queue_size: 1000 };
    const a = await services.start('a', cfg);
    base = a.url;
    const ids = await submitBatch(client, 50, 0.5);
    await untilSucceeded(client, ids, 10);
    a.kill('SIGKILL');
    await a.exited;

    const c = new pg.Client({ connectionString: services.db().url! });
    await c.connect();
    try {
      const held = await c.query<{ id: string; phase: string | null }>(`SELECT id, phase FROM executions WHERE status = 'running'`);
      expect(held.rows.length).toBeLessThanOrEqual(cfg.max_workers);
      const b = await services.start('b', cfg);
      base = b.url;
      const rows = await settledBatch(client, ids);
      const inFlight = new Set(held.rows.map((r) => r.id));
      const wrong = rows
        .map((r, i) => {
          if (r.status === 'failed' && inFlight.has(r.execution_id) && r.error?.type === 'internal_error' && /user code (had|may have) started.*not re-run/.test(r.error.message)) return null;
          return wrongSuccess(i, r);
        })
        .filter(Boolean);
      expect(wrong).toEqual([]);
      // No job's code started twice: the `running` phase is recorded once per job at most.
      const twice = await c.query<{ execution_id: string; n: number }>(
        `SELECT execution_id, count(*)::int AS n FROM execution_events
         WHERE kind = 'status' AND (data::jsonb)->>'phase' = 'running' AND execution_id = ANY($1::text[])
         GROUP BY execution_id HAVING count(*) > 1`,
        [ids],
      );
      expect(twice.rows).toEqual([]);
      // ...and the check sees something: every succeeded job has its one `running` event.
      const succeededIds = rows.filter((r) => r.status === 'succeeded').map((r) => r.execution_id as string);
      const once = await c.query<{ n: number }>(
        `SELECT count(DISTINCT execution_id)::int AS n FROM execution_events
         WHERE kind = 'status' AND (data::jsonb)->>'phase' = 'running' AND execution_id = ANY($1::text[])`,
        [succeededIds],
      );
      expect(once.rows[0]!.n).toBe(succeededIds.length);
      const succeeded = succeededIds.length;
      console.info(`kill -9: ${succeeded} succeeded, ${50 - succeeded} failed in flight (of ${held.rows.length} held at the kill)`);
      b.kill('SIGTERM');
      expect(await b.exited).toBe(0);
    } finally {
      await c.end();
    }
  }, 120_000);
});
