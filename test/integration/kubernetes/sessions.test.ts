/**
 * Sessions on the Kubernetes runtime (issue 19) against the fake API server, whose session pods run
 * the real runner (`--session --go-port`) and the real session collector as local processes, fed by
 * attach: a session's pod (labelled with its id, the gVisor RuntimeClass, read-only /code and /input),
 * state across cells, cells as execution records with their own artifacts, two sessions apart, the
 * files API with traversal attempts and planted links, a timeout that keeps the state, a kill that
 * ends the session `crashed` (as does a cell whose interpreter is killed: that cell is `killed`, not
 * `oom`), an OOM kill that ends it `oom`, idle and lifetime expiry on an injected clock, and closing
 * deleting the pod's Job.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { classify } from '../../../src/executions/classify.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import type { SessionEnd } from '../../../src/runtime/session.ts';
import { SESSION_LABELS } from '../../../src/runtime/kubernetes/session/session-job.ts';
import { SESSION_POOL_LABELS } from '../../../src/runtime/kubernetes/session/session-pool-plan.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube, useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { expectSessionFilesApi, type Send } from '../../support/session-files.ts';

type J = Record<string, any>;
const NS = 'sandpod-jobs';
let fake: FakeKube;
let database: TestDatabase;
let svc: TestService;
let restore: (() => void) | undefined;
/** The service's clock: real time, or `now` while `frozen` (the idle and lifetime test). */
let now = Date.now();
let frozen = false;
const CONFIG = { runtime: 'kubernetes', max_sessions: 4, kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false } };

const json = async (res: Response) => (await res.json()) as J;
const create = async (body: J = {}) => {
  const res = await svc.post('/sessions', body);
  const j = await json(res);
  expect(res.status, JSON.stringify(j)).toBe(201);
  return j;
};
const exec = async (id: string, body: J) => json(await svc.post(`/sessions/${id}/execute`, body));
const close = (id: string) => svc.app.request(`/sessions/${id}`, { method: 'DELETE' });
const podOf = (id: string) => fake.list('pods', NS).find((p) => p.metadata.labels?.[SESSION_LABELS.sessionId] === id);

beforeAll(async () => {
  fake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
  fake.addRuntimeClass('gvisor');
  restore = useFakeKubeconfig(fake);
  database = await freshDatabase();
  svc = await startTestService(CONFIG, { now: () => (frozen ? now : Date.now()) }, database);
}, 120_000);

afterAll(async () => {
  await svc?.close();
  await database?.drop();
  await fake?.close();
  restore?.();
});

describe('sessions on the Kubernetes runtime (fake API server, real runner and collector)', () => {
  it('a session takes the ready pooled session pod (warm_pool.session_sizes default: one of default); state and files work there', async () => {
    const stats = () => svc.runtime.sessionPoolStats!().find((x) => x.job_type === 'default');
    await fake.waitFor(() => (stats()?.ready ?? 0) >= 1, 20_000, 'a ready pooled session pod');
    const hits = stats()!.hits;
    const pooled = fake.list('pods', NS).filter((p) => p.metadata.labels?.[SESSION_POOL_LABELS.pool] && !p.metadata.labels?.[SESSION_LABELS.sessionId] && !p.metadata.deletionTimestamp);
    expect(pooled).toHaveLength(1);
    const s = await create();
    const pod = podOf(s.session_id)!;
    expect(pod.metadata.name).toBe(pooled[0]!.metadata.name);
    expect(pod.metadata.labels?.['job-name']).toMatch(/^sps-p-/);
    expect(stats()!.hits).toBe(hits + 1);
    expect(await exec(s.session_id, { code: 'y = 2' })).toMatchObject({ success: true, cell: 1 });
    expect((await svc.app.request(`/sessions/${s.session_id}/files/in.txt`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: 'abc' })).status).toBe(201);
    expect(await exec(s.session_id, { code: 'print(y * 2, open("in.txt").read())' })).toMatchObject({ success: true, stdout: '4 abc\n', cell: 2 });
    expect((await json(await close(s.session_id)))).toMatchObject({ status: 'ended', end_reason: 'closed' });
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === pod.metadata.labels?.['job-name']), 5000, 'the claimed Job deleted');
  }, 60_000);

  it('keeps state across cells in its own pod; each cell is an execution record with its own artifacts', async () => {
    const s = await create({ idle_timeout: 600 });
    expect(s).toMatchObject({ status: 'ready', job_type: 'default', cells: 0 });
    const pod = podOf(s.session_id)!;
    expect(pod.spec.runtimeClassName).toBe('gvisor');
    const main = pod.spec.containers.find((c: J) => c.name === 'main');
    expect(main.command).toContain('--session');
    expect(main.volumeMounts).toEqual(expect.arrayContaining([{ name: 'code', mountPath: '/code', readOnly: true }, { name: 'input', mountPath: '/input', readOnly: true }, { name: 'workspace', mountPath: '/workspace' }]));
    expect(pod.spec.automountServiceAccountToken).toBe(false);
    expect(fake.list('secrets', NS)).toEqual([]);
    const c1 = await exec(s.session_id, { code: 'rows = [1, 2, 3]\nopen("data.csv", "w").write("a\\n")\nprint("loaded")' });
    expect(c1).toMatchObject({ success: true, stdout: 'loaded\n', cell: 1, session_id: s.session_id });
    // (The fake maps the pod's paths to directories of its own: relative to the cells' working directory they are the same.)
    const c2 = await exec(s.session_id, {
      code: 'import json\nd = json.load(open("../input/data.json"))\njson.dump({"sum": sum(rows) + d["n"], "csv": open("data.csv").read()}, open("../output/result.json", "w"))\nopen("../output/plot.txt", "w").write("p")',
      input_data: { n: 10 },
    });
    expect(c2).toMatchObject({ success: true, output: { sum: 16, csv: 'a\n' }, cell: 2 });
    expect((await json(await svc.get(`/jobs/${c2.execution_id}?view=full`))).artifacts.map((a: J) => a.name)).toEqual(['plot.txt']);
    expect((await json(await svc.get(`/jobs/${c1.execution_id}?view=full`))).artifacts).toEqual([]);
    const c3 = await exec(s.session_id, { code: 'print(undefined_name)' });
    expect(c3).toMatchObject({ success: false, cell: 3, error: { type: 'name_error' } });
    const rec = await json(await svc.get(`/jobs/${c2.execution_id}?view=full`));
    expect(rec).toMatchObject({ status: 'succeeded', relationship: 'session', session_id: s.session_id, cell: 2 });
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ready', cells: 3 });
    const job = pod.metadata.ownerReferences![0]!.name;
    expect((await json(await close(s.session_id)))).toMatchObject({ status: 'ended', end_reason: 'closed' });
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === job), 5000, 'session Job deleted');
    expect((await svc.post(`/sessions/${s.session_id}/execute`, { code: 'print(1)' })).status).toBe(409);
  }, 60_000);

  it('two sessions cannot see each other: variables, files, pods', async () => {
    const a = await create();
    const b = await create();
    expect(podOf(a.session_id)!.metadata.name).not.toBe(podOf(b.session_id)!.metadata.name);
    expect(await exec(a.session_id, { code: 'secret = 42\nopen("mine.txt", "w").write("a")' })).toMatchObject({ success: true });
    const seen = await exec(b.session_id, { code: 'import os\nprint("secret" in globals(), os.path.exists("mine.txt"), sorted(os.listdir(".")))' });
    expect(seen).toMatchObject({ success: true, stdout: 'False False []\n' });
    expect((await json(await svc.get(`/sessions/${b.session_id}/files`))).items).toEqual([]);
    expect((await svc.get(`/sessions/${b.session_id}/files/mine.txt`)).status).toBe(404);
    expect(await svc.get(`/sessions/${a.session_id}/files/mine.txt`).then((r) => r.text())).toBe('a');
    await close(a.session_id);
    await close(b.session_id);
  }, 60_000);

  it('files API through the pod: put, get (ETag, 304, HEAD), list, delete; traversal refused on every route; links, directories and FIFOs never followed', async () => {
    const s = await create();
    const send: Send = (method, p, body, headers) => Promise.resolve(svc.app.request(p, { method, ...(headers ? { headers } : {}), ...(body === undefined ? {} : { body }) }));
    await expectSessionFilesApi(send, s.session_id, (code) => exec(s.session_id, { code }), svc.config.max_artifact_bytes);
  }, 60_000);

  it('a timed-out cell is interrupted and keeps the state; one that ignores the interrupt is killed and the session ends crashed', async () => {
    const s = await create();
    await exec(s.session_id, { code: 'x = 5' });
    const slow = svc.post(`/sessions/${s.session_id}/execute`, { code: 'import time\nwhile True: time.sleep(0.05)', timeout: 1 });
    let busy: J = {};
    for (let i = 0; i < 100 && busy.status !== 'busy'; i++) {
      busy = await json(await svc.get(`/sessions/${s.session_id}`));
      if (busy.status !== 'busy') await new Promise((r) => setTimeout(r, 20));
    }
    expect(busy.status).toBe('busy');
    const second = await svc.post(`/sessions/${s.session_id}/execute`, { code: 'print(x)' });
    expect(second.status).toBe(409);
    expect((await json(second)).running_cell_id).toBe(busy.running_cell_id);
    expect(await json(await slow)).toMatchObject({ success: false, exit_code: null, error: { type: 'execution_timeout' } });
    expect(await exec(s.session_id, { code: 'print(x)' })).toMatchObject({ success: true, stdout: '5\n' });
    const stubborn = await exec(s.session_id, { code: 'import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)', timeout: 1 });
    expect(stubborn).toMatchObject({ success: false, error: { type: 'execution_timeout' } });
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'crashed' });
  }, 60_000);

  it('a cell whose interpreter is killed (not by the memory limit) is `killed`, and the session ends crashed', async () => {
    const s = await create();
    await exec(s.session_id, { code: 'x = 1' });
    const killed = await exec(s.session_id, { code: 'import os, signal\nprint("going", flush=True)\nos.kill(os.getpid(), signal.SIGKILL)' });
    expect(killed).toMatchObject({ success: false, stdout: 'going\n', error: { type: 'killed' } });
    expect((await json(await svc.get(`/jobs/${killed.execution_id}`))).status).toBe('failed');
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'crashed' });
    expect((await svc.post(`/sessions/${s.session_id}/execute`, { code: 'print(x)' })).status).toBe(409);
  }, 60_000);

  it('an OOM kill of the pod ends the session oom; the cell says so', async () => {
    const s = await create();
    const pod = podOf(s.session_id)!.metadata.name;
    const cell = svc.post(`/sessions/${s.session_id}/execute`, { code: 'import time\nfor _ in range(200): time.sleep(0.05)' });
    for (let i = 0; i < 100 && (await json(await svc.get(`/sessions/${s.session_id}`))).status !== 'busy'; i++) await new Promise((r) => setTimeout(r, 20));
    fake.oomKill(pod);
    expect(await json(await cell)).toMatchObject({ success: false, error: { type: 'oom' } });
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'oom' });
  }, 60_000);

  it('a cell handed to a session sandbox the OOM killer already ended resolves as oom (ran nothing), not as an engine error; its files are a 409 (a lost attach a 503)', async () => {
    // The window this closes: the end lands after the cell's record is written and before the cell is
    // handed over. A throw there was retried as an engine failure and counted against the breaker.
    const jt = new FileJobTypeRegistry(svc.config).get('default')!;
    const sessionId = 'late-cell-oom';
    const sandbox = await svc.runtime.openSession!(jt, { maxStreamBytes: 32768, startupMs: 30_000, sessionId, lifetimeSec: 600 });
    try {
      const ended = new Promise<SessionEnd>((r) => sandbox.onEnd(r));
      const pod = podOf(sessionId)!.metadata.name;
      // A files request whose attach is lost under it (an API server restart): a 503 to try again, and
      // the next one goes through the attach made again.
      const inflight = sandbox.files!.list();
      expect(fake.dropAttaches(pod)).toBe(1);
      await expect(inflight).rejects.toMatchObject({ code: 'service_unavailable', status: 503 });
      expect(await sandbox.files!.list()).toEqual([]);
      fake.oomKill(pod);
      expect((await ended).reason).toBe('oom');
      const late = await sandbox.runCell({ cell: 1, code: 'print(1)', inputJson: '{}', timeoutSec: 5, maxStdoutBytes: 32768, maxArtifactBytes: 1 << 20 });
      expect(late.observation).toMatchObject({ exitCode: 137, oomKilled: true });
      expect(late.stdout).toBe('');
      expect(classify(late).error?.type).toBe('oom');
      // Its files: the API's 409 for an ended session, not an internal error.
      await expect(sandbox.files!.list()).rejects.toMatchObject({ code: 'conflict', status: 409, message: expect.stringMatching(/ended \(oom\)/) });
    } finally {
      await sandbox.destroy();
    }
  }, 60_000);

  it('the sweep ends idle and over-lifetime sessions (injected clock) and deletes their pods\' Jobs', async () => {
    const idle = await create({ idle_timeout: 60 });
    const life = await create({ idle_timeout: 3600, max_lifetime: 120 });
    const jobOf = (id: string) => podOf(id)!.metadata.labels!['job-name']!;
    const jobs = [jobOf(idle.session_id), jobOf(life.session_id)];
    now = Date.now();
    frozen = true;
    try {
      now += 61_000;
      expect(await exec(life.session_id, { code: 'print(1)' })).toMatchObject({ success: true }); // used: not idle
      await svc.sessions!.sweep();
      expect(await json(await svc.get(`/sessions/${idle.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'idle' });
      expect((await json(await svc.get(`/sessions/${life.session_id}`))).status).toBe('ready');
      now += 60_000;
      await svc.sessions!.sweep();
      expect(await json(await svc.get(`/sessions/${life.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'lifetime' });
    } finally {
      frozen = false;
    }
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => jobs.includes(j.metadata.name)), 10_000, "the expired sessions' Jobs deleted");
  }, 120_000);

  it('a lost attach (an API server restart) is made again: between cells, and during one', async () => {
    const s = await create();
    const pod = podOf(s.session_id)!.metadata.name;
    expect(await exec(s.session_id, { code: 'x = 1' })).toMatchObject({ success: true });
    expect(fake.dropAttaches(pod)).toBe(1);
    expect(await exec(s.session_id, { code: 'print(x)' })).toMatchObject({ success: true, stdout: '1\n', cell: 2 });
    const slow = svc.post(`/sessions/${s.session_id}/execute`, { code: 'import time\ntime.sleep(1.5)\nprint(x + 1)' });
    for (let i = 0; i < 100 && (await json(await svc.get(`/sessions/${s.session_id}`))).status !== 'busy'; i++) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 300));
    expect(fake.dropAttaches(pod)).toBe(1);
    expect(await json(await slow)).toMatchObject({ success: true, stdout: '2\n', cell: 3 });
    expect(fake.attaches.filter((a) => a.pod === pod)).toHaveLength(3);
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ready', cells: 3 });
    await close(s.session_id);
  }, 60_000);

  it('a new service process adopts a session whose pod lives on: variables and files kept, the same pod', async () => {
    const s = await create();
    expect(await exec(s.session_id, { code: 'x = 41\nopen("kept.txt", "w").write("k")' })).toMatchObject({ success: true, cell: 1 });
    const pod = podOf(s.session_id)!.metadata.name;
    // A graceful stop lets the session go (its pod keeps running), for the next process to adopt.
    await svc.close();
    expect(podOf(s.session_id)?.metadata.name).toBe(pod);
    svc = await startTestService(CONFIG, {}, database);
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ready', cells: 1 });
    const c2 = await exec(s.session_id, { code: 'print(x + 1, open("kept.txt").read())' });
    expect(c2).toMatchObject({ success: true, stdout: '42 k\n', cell: 2 });
    expect(await svc.get(`/sessions/${s.session_id}/files/kept.txt`).then((r) => r.text())).toBe('k');
    expect(podOf(s.session_id)!.metadata.name).toBe(pod);
    // Two attaches to that pod's collector: the first process's and the adopter's.
    expect(fake.attaches.filter((a) => a.pod === pod)).toHaveLength(2);
    await close(s.session_id);
    await fake.waitFor(() => !podOf(s.session_id), 5000, 'session pod gone');
  }, 60_000);

  it("the leader's sweep deletes the Job of an ended session whose delete failed", async () => {
    const s = await create();
    const job = podOf(s.session_id)!.metadata.ownerReferences![0]!.name;
    fake.failNext(new RegExp(`/jobs/${job}$`), 500, 1, 'DELETE');
    expect(await json(await close(s.session_id))).toMatchObject({ status: 'ended', end_reason: 'closed' });
    expect(fake.list('jobs', NS).some((j) => j.metadata.name === job)).toBe(true);
    await svc.close();
    // A replica that starts leading sweeps at once.
    svc = await startTestService(CONFIG, {}, database);
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === job), 10_000, 'the ended session Job swept');
  }, 60_000);

  it('a session whose pod is gone when adopted ends crashed', async () => {
    const s = await create();
    const pod = podOf(s.session_id)!.metadata.name;
    await svc.close();
    fake.deletePod(pod, 0);
    await fake.waitFor(() => !podOf(s.session_id), 5000, 'pod gone');
    svc = await startTestService(CONFIG, {}, database);
    expect(await json(await svc.get(`/sessions/${s.session_id}`))).toMatchObject({ status: 'ended', end_reason: 'crashed' });
  }, 60_000);
});
