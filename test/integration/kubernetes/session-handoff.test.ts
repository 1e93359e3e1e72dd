/**
 * Sessions across live replicas on the Kubernetes runtime (issue 19) against the fake API server: a
 * request for a session another live replica holds asks for it (`handoff_to`); the holder lets it go
 * between cells and the asker adopts the pod, the interpreter's state and files as they were. Two
 * services on one PostgreSQL database (PGlite cannot be shared), one fake cluster.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SESSION_LABELS } from '../../../src/runtime/kubernetes/session/session-job.ts';
import { freshDatabase, testDbKind, type TestDatabase } from '../../support/db.ts';
import { FakeKube, useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
const kind = await testDbKind();
const CONFIG = { runtime: 'kubernetes', max_sessions: 4, kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false } };

describe.skipIf(kind !== 'postgres')('a session moves between live replicas', () => {
  let fake: FakeKube;
  let database: TestDatabase;
  let a: TestService;
  let b: TestService;
  let restore: (() => void) | undefined;
  beforeAll(async () => {
    fake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
    fake.addRuntimeClass('gvisor');
    restore = useFakeKubeconfig(fake);
    database = await freshDatabase();
    a = await startTestService(CONFIG, {}, database);
    b = await startTestService(CONFIG, {}, database);
  }, 120_000);
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await database?.drop();
    await fake?.close();
    restore?.();
  });

  const json = async (res: Response) => (await res.json()) as J;
  const exec = async (svc: TestService, id: string, code: string) => json(await svc.post(`/sessions/${id}/execute`, { code }));

  it('each replica serves the session in turn: state, files and the pod kept; closing from either works', async () => {
    const created = await a.post('/sessions', {});
    const s = await json(created);
    expect(created.status, JSON.stringify(s)).toBe(201);
    const pods = () => fake.list('pods', 'sandpod-jobs').filter((p) => p.metadata.labels?.[SESSION_LABELS.sessionId] === s.session_id);
    const pod = pods()[0]!.metadata.name;
    expect(await exec(a, s.session_id, 'x = 1\nopen("f.txt", "w").write("a")')).toMatchObject({ success: true, cell: 1 });
    expect(await exec(b, s.session_id, 'x += 1\nprint(x)')).toMatchObject({ success: true, stdout: '2\n', cell: 2 });
    expect(await b.get(`/sessions/${s.session_id}/files/f.txt`).then((r) => r.text())).toBe('a');
    expect(await exec(a, s.session_id, 'print(x + 1, open("f.txt").read())')).toMatchObject({ success: true, stdout: '3 a\n', cell: 3 });
    expect(pods().map((p) => p.metadata.name)).toEqual([pod]);
    const row = await json(await b.get(`/sessions/${s.session_id}`));
    expect(row).toMatchObject({ status: 'ready', cells: 3 });
    expect((await json(await b.app.request(`/sessions/${s.session_id}`, { method: 'DELETE' })))).toMatchObject({ status: 'ended', end_reason: 'closed' });
    await fake.waitFor(() => pods().length === 0, 5000, 'session pod gone');
  }, 90_000);
});
