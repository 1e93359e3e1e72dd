/**
 * Live output on the Kubernetes runtime (issue 12): the runtime follows the `main` container's log
 * through the fake API server, which serves `GET .../log?follow=true` as a real one does (400 while
 * the container waits, chunks as the container writes, the response ended when it ends). Then the
 * whole service on that runtime: `GET /jobs/{id}/events` carries the chunks before the run ends.
 */
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobNameFor } from '../../../src/runtime/kubernetes/names.ts';
import type { Runtime } from '../../../src/runtime/runtime.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { FakeKube, podOf, spec, startRuntime, useFakeKubeconfig } from '../../support/kube-runtime.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { sseEvents, textOf, type SseEvent } from '../../support/sse.ts';

let fake: FakeKube;
let rt: Runtime;
beforeAll(async () => {
  fake = await FakeKube.start();
  fake.addRuntimeClass('gvisor');
  rt = await startRuntime(fake);
});
afterAll(async () => {
  await rt?.stop();
  await fake?.close();
});

/** A raw GET on the fake: status and body once the response ends (or `untilMs` passes). */
function rawGet(path: string, onChunk?: (c: string) => void): Promise<{ status: number; body: string; ended: boolean }> {
  return new Promise((resolve, reject) => {
    const req = http.get(fake.url + path, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        body += c;
        onChunk?.(c);
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, ended: true }));
    });
    req.on('error', reject);
  });
}

describe('fake API server: container logs', () => {
  it('400 while waiting; follow streams appended output and ends when the container ends', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.schedule(pod);
    fake.waiting(pod, 'main', 'ContainerCreating');
    const waiting = await rawGet(`/api/v1/namespaces/sandpod-jobs/pods/${pod}/log?container=main&follow=true`);
    expect(waiting.status).toBe(400);
    expect(JSON.parse(waiting.body).message).toMatch(/is waiting to start: ContainerCreating/);
    fake.mainRunning(pod);
    fake.appendLog(pod, 'main', 'one\n');
    const chunks: string[] = [];
    const follow = rawGet(`/api/v1/namespaces/sandpod-jobs/pods/${pod}/log?container=main&follow=true`, (c) => chunks.push(c));
    await fake.waitFor(() => chunks.join('') === 'one\n', 2000, 'existing log');
    fake.appendLog(pod, 'main', 'two\n');
    await fake.waitFor(() => chunks.join('') === 'one\ntwo\n', 2000, 'appended log');
    let ended = false;
    void follow.then(() => (ended = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(ended).toBe(false);
    fake.setOutput(pod, { phase: 'completed', stdout: 'one\ntwo\n', stderr: '', report: { exit_code: 0 }, files: {} });
    fake.mainTerminated(pod, 0);
    expect((await follow).body).toBe('one\ntwo\n');
    // limitBytes cuts, without follow the answer ends at once.
    expect((await rawGet(`/api/v1/namespaces/sandpod-jobs/pods/${pod}/log?container=main&limitBytes=5`)).body).toBe('one\nt');
    await running;
  });
});

describe('kubernetes runtime: onOutput follows the main container log', () => {
  it('reports installing, then chunks as the container writes them, before the run resolves', async () => {
    const s = spec({ requirements: ['numpy'] });
    const phases: string[] = [];
    const got: { stream: string; text: string; at: number }[] = [];
    let resolved = false;
    const running = rt.run(s, { onPhase: (p) => phases.push(p), onOutput: (stream, c) => got.push({ stream, text: Buffer.from(c).toString(), at: Date.now() }) });
    void running.then(() => (resolved = true));
    const pod = await podOf(fake, s);
    fake.schedule(pod);
    fake.depsRunning(pod);
    await fake.waitFor(() => phases.includes('installing'), 2000, 'installing phase');
    fake.depsTerminated(pod, 0);
    fake.mainRunning(pod);
    await fake.waitFor(() => phases.includes('execution'), 2000, 'execution phase');
    await fake.waitFor(() => fake.openLogFollows === 1, 2000, 'log follow open');
    fake.appendLog(pod, 'main', 'hello ');
    await fake.waitFor(() => got.map((g) => g.text).join('') === 'hello ', 2000, 'first chunk');
    expect(resolved).toBe(false);
    fake.appendLog(pod, 'main', 'world\n');
    await fake.waitFor(() => got.map((g) => g.text).join('') === 'hello world\n', 2000, 'second chunk');
    fake.setOutput(pod, { phase: 'completed', stdout: 'hello world\n', stderr: '', report: { exit_code: 0 }, files: {} });
    fake.mainTerminated(pod, 0);
    const raw = await running;
    expect(raw.stdout).toBe('hello world\n');
    expect(phases).toEqual(['installing', 'execution']);
    expect(new Set(got.map((g) => g.stream))).toEqual(new Set(['stdout']));
    await fake.waitFor(() => fake.openLogFollows === 0, 2000, 'follow closed');
  });

  it('a cancelled run stops following at once', async () => {
    const s = spec();
    const ac = new AbortController();
    const running = rt.run(s, { signal: ac.signal, onOutput: () => {} });
    const pod = await podOf(fake, s);
    fake.schedule(pod);
    fake.mainRunning(pod);
    await fake.waitFor(() => fake.openLogFollows === 1, 2000, 'log follow open');
    ac.abort('cancel');
    const raw = await running;
    expect(raw.observation.cancelled).toBe(true);
    await fake.waitFor(() => fake.openLogFollows === 0, 2000, 'follow closed');
  });
});

describe('the service on the Kubernetes runtime: GET /jobs/{id}/events', () => {
  let k: FakeKube;
  let database: TestDatabase;
  let svc: TestService;
  let restore: (() => void) | undefined;
  beforeAll(async () => {
    k = await FakeKube.start();
    k.addRuntimeClass('gvisor');
    k.upsertJobType('sandpod', 'default', { pythonVersion: '3.11', memoryLimit: '256m', cpuLimit: 0.5, timeout: 20 });
    restore = useFakeKubeconfig(k);
    database = await freshDatabase();
    svc = await startTestService({ runtime: 'kubernetes', kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, watch_job_types: true, preflight: false } }, {}, database);
  });
  afterAll(async () => {
    await svc?.close();
    await database?.drop();
    await k?.close();
    restore?.();
  });

  it('chunks of the container log arrive as stdout events before the run ends; end carries the record', async () => {
    const res = await svc.post('/execute/async', { code: 'print("x")' });
    const id = ((await res.json()) as { job_id: string }).job_id;
    const stream = sseEvents(await svc.get(`/jobs/${id}/events`));
    const seen: SseEvent[] = [];
    const next = async () => {
      const r = await stream.next();
      if (!r.done) seen.push(r.value);
      return r.value as SseEvent;
    };
    const pod = await k.waitForPod(jobNameFor(id), 10_000);
    k.schedule(pod);
    k.mainRunning(pod);
    await k.waitFor(() => k.openLogFollows === 1, 5000, 'log follow open');
    k.appendLog(pod, 'main', 'partial line ');
    while ((await next()).event !== 'stdout');
    expect(seen.at(-1)!.json.data).toBe('partial line ');
    expect(((await (await svc.get(`/jobs/${id}`)).json()) as { status: string }).status).toBe('running');
    k.appendLog(pod, 'main', 'done\n');
    k.setOutput(pod, { phase: 'completed', stdout: 'partial line done\n', stderr: '', report: { exit_code: 0 }, files: {} });
    k.mainTerminated(pod, 0);
    for (let e = await next(); e && e.event !== 'end'; e = await next());
    expect(textOf(seen, 'stdout')).toBe('partial line done\n');
    expect(seen.filter((e) => e.event === 'status').map((e) => e.json.phase)).toEqual(['queued', 'starting', 'running', 'finished']);
    expect(seen.at(-1)!.json).toMatchObject({ status: 'succeeded', stdout: 'partial line done\n' });
  });
});
