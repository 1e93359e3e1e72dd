/**
 * A transient fault of the machinery never fails queued work for good (issue 22 item 4). The real
 * local runtime, wrapped so the test can make every run fail before user code starts (as a full
 * workspace does). While the breaker is open the dispatcher claims nothing; a job the machinery
 * failed goes back to the queue with a backoff and runs once the fault is gone; past the bound of
 * requeues it fails, and its idempotency key may then be submitted again (a new job).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_INFRA_REQUEUES } from '../../../src/executions/requeue.ts';
import { withRun } from '../../support/runtime-wrap.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;

describe('infrastructure faults and queued jobs', () => {
  let svc: TestService;
  let failing = false;
  let calls = 0;
  beforeAll(async () => {
    svc = await startTestService(
      { max_workers: 2, breaker: { failure_threshold: 3, recovery_timeout_ms: 1500, success_threshold: 2 } },
      {
        runtime: async (real) => {
          const r = await real();
          return withRun(r, (spec, opts) => {
            calls++;
            if (failing) return Promise.reject(new Error(`ENOSPC: no space left on device, mkdir '/ws/runs/${spec.executionId}'`));
            return r.run(spec, opts);
          });
        },
      },
    );
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  const status = async (id: string) => ((await (await svc.get(`/jobs/${id}`)).json()) as J).status as string;

  it('20 jobs through a fault that opens the breaker: none fails, each runs once the fault is gone', async () => {
    failing = true;
    calls = 0;
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) ids.push(((await (await svc.post('/execute/async', { code: `print(${i})` })).json()) as J).job_id);
    // Let the fault open the breaker, recover (half-open probes) and open again a few times.
    const opened = Date.now() + 10_000;
    while (svc.breaker.state !== 'open' && Date.now() < opened) await new Promise((r) => setTimeout(r, 20));
    expect(svc.breaker.state).toBe('open');
    await new Promise((r) => setTimeout(r, 5000));
    const during = await Promise.all(ids.map(status));
    expect(during.filter((s) => !['queued', 'running'].includes(s))).toEqual([]);
    // The dispatcher did not hammer the failing engine: three failures opened the circuit, then about
    // one probe per recovery period (two attempts each), not a claim of every queued job.
    expect(calls).toBeLessThan(20);
    const rows = await svc.db.kysely.selectFrom('executions').select(['infra_failures']).where('id', 'in', ids).execute();
    expect(Math.max(...rows.map((r) => r.infra_failures))).toBeLessThan(MAX_INFRA_REQUEUES);

    failing = false;
    for (const [i, id] of ids.entries()) {
      const res = (await (await svc.get(`/jobs/${id}/result?wait=true&timeout=60`)).json()) as J;
      expect(res, id).toMatchObject({ status: 'succeeded', stdout: `${i}\n` });
    }
    expect(svc.breaker.state).toBe('closed');
    const metrics = await (await svc.get('/metrics')).text();
    const requeues = (reason: string) => Number(new RegExp(`^sandpod_requeues_total\\{reason="${reason}"\\} (\\d+)$`, 'm').exec(metrics)?.[1] ?? 0);
    expect(requeues('infra_failure')).toBeGreaterThan(0);
  }, 120_000);

  it('past the bound the job fails (before its code started); its key may be submitted again', async () => {
    failing = true;
    // Hold dispatch with an open circuit while the job is set one requeue short of failing.
    while (svc.breaker.state !== 'open') svc.breaker.recordFailure();
    const first = await svc.post('/execute/async', { code: 'print("again")', idempotency_key: 'infra-key' });
    expect(first.status).toBe(202);
    const old = ((await first.json()) as J).job_id as string;
    await svc.db.kysely.updateTable('executions').set({ infra_failures: MAX_INFRA_REQUEUES }).where('id', '=', old).execute();
    const done = (await (await svc.get(`/jobs/${old}/result?wait=true&timeout=20`)).json()) as J;
    // Its probe's failure re-opened the circuit: the type says so, the message names the engine's error.
    expect(done).toMatchObject({ status: 'failed', error: { type: expect.stringMatching(/^(internal_error|service_unavailable)$/), message: expect.stringMatching(/ENOSPC/) } });
    const row = await svc.db.kysely.selectFrom('executions').select(['failed_before_start', 'infra_failures']).where('id', '=', old).executeTakeFirstOrThrow();
    expect(row).toEqual({ failed_before_start: true, infra_failures: MAX_INFRA_REQUEUES });

    failing = false;
    const again = await svc.post('/execute/async', { code: 'print("again")', idempotency_key: 'infra-key' });
    expect(again.status).toBe(202);
    const body = (await again.json()) as J;
    expect(body).toMatchObject({ created: true, idempotency_key: 'infra-key', status: 'pending' });
    expect(body.job_id).not.toBe(old);
    // The key now names the new job; the old record still shows the key it was created with.
    const replay = (await (await svc.post('/execute/async', { code: 'print("again")', idempotency_key: 'infra-key' })).json()) as J;
    expect(replay).toMatchObject({ created: false, job_id: body.job_id });
    expect(((await (await svc.get(`/executions/${old}?view=full`)).json()) as J).idempotency_key).toBe('infra-key');
    const res = (await (await svc.get(`/jobs/${body.job_id}/result?wait=true&timeout=60`)).json()) as J;
    expect(res).toMatchObject({ status: 'succeeded', stdout: 'again\n' });
    // A job whose own code failed keeps its key.
    const own = ((await (await svc.post('/execute/async', { code: 'raise SystemExit(3)', idempotency_key: 'own-key' })).json()) as J).job_id;
    expect(((await (await svc.get(`/jobs/${own}/result?wait=true&timeout=60`)).json()) as J).status).toBe('failed');
    expect((await svc.post('/execute/async', { code: 'raise SystemExit(3)', idempotency_key: 'own-key' })).status).toBe(200);
  }, 120_000);
});
