/**
 * 50 async jobs across a SIGTERM (issue 22, "What must hold", and item 8): a service process is
 * stopped gracefully while it serves the queue. During its drain the port keeps answering — new
 * submissions 503 `shutting_down` with `Retry-After`, `/health` `draining` — the runs in flight
 * finish there, the process exits 0, and a second process runs what was still queued. Every job
 * succeeds with its own output and was claimed exactly once (nothing requeued, nothing run twice).
 * PostgreSQL only: two processes share the database.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { testDbKind } from '../../support/db.ts';
import { httpClient, settledBatch, submitBatch, untilSucceeded, wrongSuccess } from '../../support/job-batch.ts';
import { useServiceProcesses } from '../../support/service-processes.ts';

const kind = await testDbKind();

describe.skipIf(kind !== 'postgres')('50 queued jobs across a SIGTERM', () => {
  const services = useServiceProcesses();
  let base = '';
  const client = httpClient(() => base);

  it('the drain answers 503, in-flight jobs finish, the next process runs the rest; each job once', async () => {
    // The drain's grace outlasts the long job by far: it ends there, never cut.
    const cfg = { max_workers: 3, max_queue_size: 1000, shutdown_grace_seconds: 90 };
    const a = await services.start('a', cfg, { ownWorkspace: true });
    base = a.url;
    // A long job keeps the drain open long enough to look at it: long enough that it still runs
    // after six others ran, also on a loaded machine (15 s was not, in CI).
    const long = (await client.post('/execute/async', { code: 'import time\ntime.sleep(40)\nprint("long")', timeout: 90 })).body.job_id as string;
    const ids = await submitBatch(client, 50);
    await untilSucceeded(client, ids, 6);
    expect((await client.get(`/jobs/${long}`)).body.status).toBe('running');

    a.kill('SIGTERM');
    let refused: { status: number; body: Record<string, unknown>; retryAfter: string | null } | null = null;
    for (const until = Date.now() + 5000; !refused && Date.now() < until; ) {
      const res = await fetch(`${a.url}/execute/async`, { method: 'POST', headers: { 'content-type': 'application/json', connection: 'close' }, body: JSON.stringify({ code: 'print(1)' }) });
      const body = (await res.json()) as Record<string, unknown>;
      // Sent before the signal was handled: an ordinary job, which must end like the others.
      if (res.status === 202) ids.push(body.job_id as string);
      else refused = { status: res.status, body, retryAfter: res.headers.get('retry-after') };
    }
    expect(refused).toMatchObject({ status: 503, body: { code: 'shutting_down', detail: expect.any(String), correlation_id: expect.any(String) }, retryAfter: '2' });
    const health = await fetch(`${a.url}/health`, { headers: { connection: 'close' } });
    expect(health.status).toBe(503);
    expect(await health.json()).toMatchObject({ status: 'draining' });
    expect(await a.exited).toBe(0);

    const b = await services.start('b', cfg, { ownWorkspace: true });
    base = b.url;
    const rows = await settledBatch(client, ids);
    const wrong = rows.map((r, i) => (i < 50 ? wrongSuccess(i, r) : r.status === 'succeeded' && r.stdout === '1\n' ? null : `late job ${r.execution_id}: ${r.status}`)).filter(Boolean);
    expect(wrong).toEqual([]);
    expect((await client.get(`/jobs/${long}/result`)).body).toMatchObject({ status: 'succeeded', stdout: 'long\n' });
    // Claimed once each: A finished what it held, B ran what was queued.
    const c = new pg.Client({ connectionString: services.db().url! });
    await c.connect();
    try {
      const r = await c.query<{ id: string; attempts: number }>('SELECT id, attempts FROM executions WHERE id = ANY($1::text[]) AND attempts <> 1', [[...ids, long]]);
      expect(r.rows).toEqual([]);
    } finally {
      await c.end();
    }
    b.kill('SIGTERM');
    expect(await b.exited).toBe(0);
  }, 240_000);
});
