/**
 * Sessions with requirements (issue 19: `POST /sessions {requirements}`), on the real local runtime
 * and database: the session's own requirements and its job type's are installed (or found cached) as
 * a run's are and mounted at `/deps` for every cell; the cells' records carry them; a package pip
 * cannot find is a 422 `dependency_error` with pip's words, an option-like one a 400.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildWheels } from '../../support/wheel.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const asRoot = process.getuid?.() === 0;

describe.skipIf(!asRoot)('sessions with requirements', () => {
  let svc: TestService;
  beforeAll(async () => {
    const wheels = buildWheels([
      { name: 'sandpod-sesspkg', version: '1.2.0' },
      { name: 'sandpod-typepkg', version: '3.0.0' },
    ]);
    svc = await startTestService({
      warm_pool: { sizes: {} },
      pip: { no_index: true, find_links: [wheels] },
      job_types: [{ name: 'typed', requirements: ['sandpod-typepkg'] }],
    });
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  const json = async (res: Response) => (await res.json()) as Record<string, any>;

  it('the session’s own requirements and its job type’s are at every cell; the cells’ records list them', async () => {
    const res = await svc.post('/sessions', { job_type: 'typed', requirements: ['sandpod-sesspkg'] });
    const s = await json(res);
    expect(res.status, JSON.stringify(s)).toBe(201);
    const c1 = await json(await svc.post(`/sessions/${s.session_id}/execute`, { code: 'import sandpod_sesspkg, sandpod_typepkg\nx = sandpod_sesspkg.VALUE\nprint(x, sandpod_typepkg.VALUE)' }));
    expect(c1).toMatchObject({ success: true, stdout: 'sandpod-sesspkg-1.2.0 sandpod-typepkg-3.0.0\n' });
    const c2 = await json(await svc.post(`/sessions/${s.session_id}/execute`, { code: 'import os\nprint(x)\ntry:\n    open("/deps/x", "w")\nexcept OSError as e:\n    print("deps read-only", type(e).__name__)' }));
    expect(c2.stdout).toMatch(/^sandpod-sesspkg-1\.2\.0\ndeps read-only \w+\n$/);
    const rec = await json(await svc.get(`/jobs/${c1.execution_id}?view=full`));
    // As for a run: the record lists what the request added; the job type's are the type's.
    expect(rec.requirements).toEqual(['sandpod-sesspkg']);
    await svc.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' });
  }, 240_000);

  it('a package pip cannot find is 422 dependency_error with pip’s words; an option-like one is 400', async () => {
    const missing = await svc.post('/sessions', { requirements: ['sandpod-no-such-package'] });
    const body = await json(missing);
    expect(missing.status, JSON.stringify(body)).toBe(422);
    expect(body.code).toBe('dependency_error');
    expect(body.detail).toMatch(/sandpod-no-such-package/i);
    const option = await svc.post('/sessions', { requirements: ['--index-url=http://evil.invalid/'] });
    expect(option.status).toBe(400);
    expect((await json(option)).code).toBe('validation_error');
    // Neither left a live session behind.
    const page = await json(await svc.get('/sessions'));
    const rows = (page.items ?? page.sessions ?? page.data) as { status: string; end_reason: string | null }[];
    expect(rows.filter((r) => r.status !== 'ended')).toEqual([]);
    expect(rows.filter((r) => r.end_reason === 'crashed')).toHaveLength(1);
  }, 240_000);
});
