/**
 * Sessions from the warm pool over the API (issue 19), on the real local runtime and database: once
 * /pool/stats shows a ready session sandbox, POST /sessions takes it and the session says `warm: true`
 * (201 body, GET /sessions/{id}, the list); a session opened while none is ready says `warm: false`;
 * /pool/stats `sessions` and /metrics count the hit and the miss.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';

const asRoot = process.getuid?.() === 0;

describe.skipIf(!asRoot)('sessions from the warm pool, over the API', () => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService({ max_sessions: 3, warm_pool: { sizes: {}, session_sizes: { default: 1 } } });
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  const json = async (res: Response) => (await res.json()) as Record<string, any>;
  const pool = async () => ((await json(await svc.get('/pool/stats'))).sessions as Record<string, any>[]).find((s) => s.job_type === 'default');

  it('a session taking the ready sandbox is warm (201, GET, list); one opened while none is ready is not; stats count both', async () => {
    for (let i = 0; i < 600 && (await pool())?.ready !== 1; i++) await new Promise((r) => setTimeout(r, 100));
    expect(await pool()).toMatchObject({ target: 1, ready: 1, starting: 0, hits: 0, misses: 0 });
    const [a, b] = await Promise.all([svc.post('/sessions', {}), svc.post('/sessions', {})]);
    expect([a.status, b.status]).toEqual([201, 201]);
    const [ja, jb] = [await json(a), await json(b)];
    expect([ja.warm, jb.warm].sort()).toEqual([false, true]);
    const warm = ja.warm ? ja : jb;
    const cold = ja.warm ? jb : ja;
    expect(await json(await svc.get(`/sessions/${warm.session_id}`))).toMatchObject({ status: 'ready', warm: true });
    expect(await json(await svc.get(`/sessions/${cold.session_id}`))).toMatchObject({ status: 'ready', warm: false });
    const list = (await json(await svc.get('/sessions'))).items as Record<string, any>[];
    expect(Object.fromEntries(list.map((s) => [s.session_id, s.warm]))).toMatchObject({ [warm.session_id]: true, [cold.session_id]: false });
    // The pool-taken session works as any.
    const c = await json(await svc.post(`/sessions/${warm.session_id}/execute`, { code: 'x = 2\nprint(x * 21)' }));
    expect(c).toMatchObject({ success: true, stdout: '42\n', cell: 1 });
    expect(await pool()).toMatchObject({ hits: 1, misses: 1 });
    const metrics = await (await svc.get('/metrics')).text();
    expect(metrics).toContain('sandpod_session_pool_claims_total{job_type="default",outcome="hit"} 1');
    expect(metrics).toContain('sandpod_session_pool_claims_total{job_type="default",outcome="miss"} 1');
    for (const s of [warm, cold]) await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' });
  }, 180_000);
});
