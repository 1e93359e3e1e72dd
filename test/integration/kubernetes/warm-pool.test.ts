/**
 * The cluster warm pool against the fake API server, whose warm pods run the real runner (in
 * `--wait` mode, fed through attach): pool fill, claims with labels on Job and pod, delivery of
 * code and input, `done` ending the run, the refill waiting for the run, never-reuse, claim races
 * between two runtime instances,
 * adoption after a restart, the pool following JobType changes, and the timeout counted from delivery.
 */
import { existsSync, mkdtempSync, readFileSync, readlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { V1Job } from '@kubernetes/client-node';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { JobType } from '../../../src/jobtypes/job-type.ts';
import { POOL_LABELS, coldAttachJob } from '../../../src/runtime/kubernetes/pool/pool-plan.ts';
import type { KubeApi } from '../../../src/kube/index.ts';
import { FENCE_COMMAND, LABELS } from '../../../src/runtime/kubernetes/names.ts';
import { handOverPayload } from '../../../src/runtime/kubernetes/runs/hand-over.ts';
import { shippedSources, sourcesConfigMap, sourcesName } from '../../../src/runtime/kubernetes/runs/runner-sources.ts';
import { FencedError, LeftRunningError, RunGoneError, type RawRun, type Runtime, type RunSpec } from '../../../src/runtime/runtime.ts';
import { FakeKube, jobType, spec, startRuntime, testConfig } from '../../support/kube-runtime.ts';

const NS = 'sandpod-jobs';
const TEXTS = shippedSources();
const runnerSource = TEXTS.runner;
/** The sources ConfigMap attach pods mount (runs/runner-sources.ts). */
const SOURCES = sourcesName(TEXTS);
/** Creates an attach Job as a service process does: its sources ConfigMap first. */
async function createAttachJob(api: KubeApi, job: V1Job): Promise<void> {
  await api.createConfigMap(sourcesConfigMap(NS, 'sandpod', TEXTS));
  await api.createJob(job);
}
let fake: FakeKube;
const runtimes: Runtime[] = [];
let types: JobType[];

async function start(over: Record<string, unknown> = {}, tuning: { poolRefillDelayMs?: number } = {}): Promise<Runtime> {
  const rt = await startRuntime(fake, {
    config: testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, warm_pool_size: 2, ...over } }),
    options: { runnerSource, jobTypes: () => types, tuning: { podGoneGraceMs: 150, execTimeoutMs: 5000, informerBackoffInitialMs: 20, informerBackoffMaxMs: 200, healthCacheMs: 0, poolIntervalMs: 50, ...tuning } },
  });
  runtimes.push(rt);
  return rt;
}

/**
 * Starts a run (its program appends to a ledger file) whose attach the fake holds open, then gives
 * it back as a stopping service does.
 */
async function givenBackWithAttachHeld(rt: Runtime): Promise<{ s: RunSpec; ledger: string; going: Promise<RawRun> }> {
  const ledger = path.join(mkdtempSync(path.join(tmpdir(), 'ledger-')), 'ran');
  const s = spec({ code: `open(${JSON.stringify(ledger)}, "a").write("x")\nprint("ran")` });
  fake.hang({ path: /\/attach$/, only: 'requests' });
  const ac = new AbortController();
  const going = rt.run(s, { signal: ac.signal, leaveOnShutdown: true });
  going.catch(() => undefined);
  await fake.waitFor(() => fake.hungRequests > 0, 10_000, 'an attach held open');
  ac.abort('shutdown');
  return { s, ledger, going };
}

/** The pool pod a warm run claimed (it carries the run's labels once claimed). */
async function claimedPod(id: string): Promise<string> {
  const find = () => fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === id)?.metadata.name;
  await fake.waitFor(() => !!find(), 5000, `the pod of ${id}`);
  return find()!;
}
const poolJobs = (jobTypeName = 'default') => fake.list('jobs', NS).filter((j) => j.metadata.labels?.[POOL_LABELS.pool] === jobTypeName);
const idle = (jobTypeName = 'default') => poolJobs(jobTypeName).filter((j) => !j.metadata.labels?.[LABELS.executionId]);
const readyIdle = () =>
  idle().filter((j) => {
    const pod = fake.podOfJob(j.metadata.name);
    // Ready as the pool counts it: main running and its startup probe passed (the runner's ready port).
    const main = pod?.status?.containerStatuses?.find((c: { name: string }) => c.name === 'main');
    return main?.state?.running && main.started && !pod?.metadata.deletionTimestamp;
  });

/**
 * The pool ready as the fake shows it and as the newest runtime's informer sees it: a claim made
 * before its cache caught up would miss and start cold (on a loaded machine that lag is seconds).
 */
const poolReady = () => readyIdle().length === 2 && (runtimes.at(-1)?.warmPoolStats!().find((x) => x.job_type === 'default')?.ready ?? 0) >= 2;

/** The next `n` fence execs (FENCE_COMMAND) fail as an exec on a starved node does: no answer from the claim. */
function failFences(n: number): void {
  let left = n;
  fake.onExec((call) => (call.command.join(' ') === FENCE_COMMAND.join(' ') && left-- > 0 ? { exitCode: 1, stderr: 'error: unable to upgrade connection' } : undefined));
}

beforeEach(async () => {
  fake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
  fake.addRuntimeClass('gvisor');
  types = [jobType()];
});
afterEach(async () => {
  for (const rt of runtimes.splice(0)) await rt.stop();
  await fake.close();
});

describe('cluster warm pool (fake API server, real runner)', () => {
  it('fills the pool, and a run claims a pod: labels on Job and pod, code and input by attach, done ends it', async () => {
    const rt = await start();
    await fake.waitFor(() => poolReady(), 20_000, 'two ready pool pods');
    // Their runner and collector came from the sources ConfigMap (the fake, like the kubelet, starts
    // no pod whose ConfigMap volume is missing).
    const [cm] = fake.list('configmaps', NS);
    expect((cm?.data as Record<string, string> | undefined)?.['runner.py']).toBe(runnerSource);
    for (const j of poolJobs()) expect(j.spec.template.spec.volumes).toContainEqual({ name: 'runner', configMap: { name: cm!.metadata.name, defaultMode: 0o444 } });
    // (The fake maps the runner's paths to its own directories: the program reads its input through them.)
    const s = spec({ code: 'import json, sys\nprint(json.load(open(sys.argv[0].replace("/code/main.py", "/input/data.json")))["x"] * 2)', inputJson: '{"x": 21}' });
    const raw = await rt.run(s);
    expect(raw.observation).toMatchObject({ exitCode: 0, phase: 'completed', infraError: null });
    expect(raw.stdout).toBe('42\n');
    // Startup is the claim and the hand-over, not a pod start (a generous bound: a loaded machine).
    expect(raw.observation.startupMs).toBeLessThan(5000);
    const claimed = fake.list('jobs', NS).filter((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId);
    expect(claimed).toHaveLength(1);
    expect(claimed[0]!.metadata.labels?.[POOL_LABELS.pool]).toBe('default');
    const pods = fake.list('pods', NS).filter((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId);
    expect(pods).toHaveLength(1);
    expect(pods[0]!.metadata.annotations?.['sandpod.io/execution-id']).toBe(s.executionId);
    // No Secret: nothing but the attach carried the program.
    expect(fake.list('secrets', NS)).toEqual([]);
    // The collector got the program and its input (main has no stdin at all).
    const attach = fake.attaches.find((a) => a.pod === pods[0]!.metadata.name)!;
    expect(attach.container).toBe('collector');
    const sent = Buffer.concat(attach.stdin).toString('utf8');
    const header = JSON.parse(sent.slice(0, sent.indexOf('\n'))) as Record<string, unknown>;
    expect(header).toMatchObject({ code: Buffer.byteLength(s.code), input: Buffer.byteLength(s.inputJson), go: { timeout: s.timeoutSec } });
    expect(sent.slice(sent.indexOf('\n') + 1, sent.indexOf('\n') + 1 + s.code.length + s.inputJson.length)).toBe(s.code + s.inputJson);
    // Then, once the outputs came back on the attach, the line that lets the collector go.
    await fake.waitFor(() => Buffer.concat(attach.stdin).toString('utf8').endsWith(s.inputJson + 'release\n'), 5000, 'release line');
    // main's log is the program's output, as on a cold pod: no phase lines.
    expect(fake.logOf(pods[0]!.metadata.name, 'main')).toBe('42\n');
    // The outputs came back on the attach before `done` (deliver.py --output), and the collector was
    // released there too: no exec into the pod at all.
    expect(fake.execs.filter((e) => e.pod === pods[0]!.metadata.name)).toEqual([]);
    // The claim deadline counts from the claim: the pod's age plus the run's limits.
    expect(claimed[0]!.spec.activeDeadlineSeconds).toBeLessThan(s.timeoutSec + 5 + 10);
    const stats = rt.warmPoolStats!();
    expect(stats.find((x) => x.job_type === 'default')).toMatchObject({ target: 2, hits: 1, misses: 0 });
    // The pool refills.
    await fake.waitFor(() => poolReady(), 20_000, 'refilled');
  });

  it('a pool pod is claimed once its startup probe passed, before the kubelet reports main ready (1.20: at its next sync, up to a minute later)', async () => {
    fake.probeReadyLagMs = 60_000;
    const rt = await start();
    await fake.waitFor(() => poolReady(), 20_000, 'two pool pods past their startup probe');
    // Past their probe and still not `ready` in their status: the pool went on `started`.
    const mains = readyIdle().map((j) => fake.podOfJob(j.metadata.name)?.status?.containerStatuses?.find((c: { name: string }) => c.name === 'main'));
    expect(mains.map((c) => [c?.started, c?.ready])).toEqual([[true, false], [true, false]]);
    const raw = await rt.run(spec({ code: 'print(6 * 7)' }));
    expect(raw.stdout).toBe('42\n');
    expect(rt.warmPoolStats!().find((x) => x.job_type === 'default')).toMatchObject({ hits: 1, misses: 0 });
  });

  it('never reuses a pod: a file and an environment change of one run are not seen by the next', async () => {
    const rt = await start();
    await fake.waitFor(() => poolReady(), 20_000, 'ready');
    const a = await rt.run(spec({ code: 'import os\nopen("mark", "w").write("x")\nos.environ["MARK"] = "1"\nos.putenv("MARK", "1")\nprint(os.getpid())' }));
    expect(a.observation.exitCode).toBe(0);
    await fake.waitFor(() => poolReady(), 20_000, 'refilled');
    const b = await rt.run(spec({ code: 'import os\nprint(os.path.exists("mark"), os.environ.get("MARK"))' }));
    expect(b.stdout).toBe('False None\n');
    const claimedPods = fake.list('pods', NS).filter((p) => p.metadata.labels?.[LABELS.executionId]);
    expect(new Set(claimedPods.map((p) => p.metadata.name)).size).toBe(claimedPods.length);
  });

  it("a claimed pod's refill waits for its run while another pod is ready, and starts when the run ends", async () => {
    const rt = await start({}, { poolRefillDelayMs: 60_000 });
    await fake.waitFor(() => poolReady(), 20_000, 'two ready pool pods');
    const names = () => new Set(poolJobs().map((j) => j.metadata.name));
    const before = names();
    const running = rt.run(spec({ code: 'import time\ntime.sleep(1.5)\nprint(1)' }));
    await fake.waitFor(() => poolJobs().some((j) => j.metadata.labels?.[LABELS.executionId]), 20_000, 'claimed');
    // While the run goes on (the pool reconciles every 50 ms meanwhile), no new pool Job.
    await new Promise((r) => setTimeout(r, 1000));
    expect([...names()].filter((n) => !before.has(n))).toEqual([]);
    const raw = await running;
    expect(raw.stdout).toBe('1\n');
    // Its end lets the refill go at once, long before the 60 s limit.
    await fake.waitFor(() => [...names()].some((n) => !before.has(n)), 5000, 'refill after the run');
  });

  it('two runtime instances on one fake never claim the same pod', async () => {
    // One pool (one instance label) kept by both: eight pods for six runs. Both may briefly make more
    // than eight and trim the excess; a claim that meets a pod being trimmed moves on, and one that
    // finds none left goes cold — here by attach, which the fake runs like a pool pod (it starts no
    // Secret-fed cold pod by itself), so a miss on a busy machine ends instead of hanging.
    const one = await start({ warm_pool_size: 8, cold_start: 'attach' });
    const two = await start({ warm_pool_size: 8, cold_start: 'attach' });
    await fake.waitFor(() => readyIdle().length >= 8, 15000, 'ready');
    const specs = Array.from({ length: 6 }, (_, i) => spec({ code: `print(${i})` }));
    const raws = await Promise.all(specs.map((s, i) => (i % 2 ? one : two).run(s)));
    expect(raws.map((r) => r.stdout)).toEqual(specs.map((_, i) => `${i}\n`));
    const byPod = new Map<string, string[]>();
    for (const p of fake.list('pods', NS)) {
      const id = p.metadata.labels?.[LABELS.executionId];
      if (id) byPod.set(p.metadata.name, [...(byPod.get(p.metadata.name) ?? []), id]);
    }
    for (const ids of byPod.values()) expect(ids).toHaveLength(1);
    // Each pod's collector got exactly one hand-over. (A claim that lost its race may have attached
    // already: such an attach wrote nothing.)
    const attachedPods = fake.attaches.filter((a) => a.stdin.length > 0).map((a) => a.pod);
    expect(new Set(attachedPods).size).toBe(attachedPods.length);
    expect(attachedPods).toHaveLength(raws.length);
    const stats = [one, two].flatMap((r) => r.warmPoolStats!());
    const hits = stats.reduce((n, x) => n + x.hits, 0);
    expect(hits + stats.reduce((n, x) => n + x.misses, 0)).toBe(6);
    expect(hits).toBeGreaterThanOrEqual(3);
    // Every hit was a claim (a Job patch); both take the oldest ready pod first, so claims often lose
    // the race (409) and go on to the next, but not always: how they interleave is the machine's.
    const claims = fake.requests.filter((r) => r.method === 'PATCH' && r.path.includes('/jobs/')).length;
    expect(claims).toBeGreaterThanOrEqual(hits);
  });

  it('the attach begins with the claim; a claim that loses leaves its attach open and unwritten, and the pod serves a later run', async () => {
    const rt = await start();
    // Ready as this runtime's cache sees it too (the second candidate must be there).
    await fake.waitFor(() => poolReady(), 20_000, 'ready');
    // The first candidate's patch and its retry at the version read again both get 409, as when
    // another replica claimed it between our read and our patch.
    fake.failNext(/\/apis\/batch\/v1\/namespaces\/[^/]+\/jobs\/[^/]+$/, 409, 2, 'PATCH');
    const a = spec({ code: 'print("a")' });
    const ra = await rt.run(a);
    expect(ra.stdout).toBe('a\n');
    const podA = await claimedPod(a.executionId);
    const early = fake.attaches.filter((x) => x.pod !== podA);
    // The lost pod was attached to before its claim was decided; nothing was written, and the attach
    // was not closed (with stdinOnce, closing it would close the collector's stdin).
    expect(early).toHaveLength(1);
    expect(early[0]!.stdin).toEqual([]);
    expect(early[0]!.ended).toBe(false);
    const lost = early[0]!.pod;
    expect(fake.list('pods', NS).find((p) => p.metadata.name === lost)?.metadata.labels?.[LABELS.executionId]).toBeUndefined();
    // That pod is still idle and whole: the next run takes it (oldest first) and runs on it.
    const b = spec({ code: 'print("b")' });
    const rb = await rt.run(b);
    expect(rb.stdout).toBe('b\n');
    expect(await claimedPod(b.executionId)).toBe(lost);
    expect(fake.attaches.filter((x) => x.pod === lost).map((x) => x.stdin.length > 0)).toEqual([false, true]);
    expect(rt.warmPoolStats!().find((x) => x.job_type === 'default')).toMatchObject({ hits: 2, misses: 0, handover_retries: 0 });
  });

  it('two runs of one replica at once claim different pods without racing: no 409, no spare attach', async () => {
    const rt = await start();
    await fake.waitFor(() => poolReady(), 20_000, 'ready');
    const from = fake.requests.length;
    const specs = [spec({ code: 'print(1)' }), spec({ code: 'print(2)' })];
    const raws = await Promise.all(specs.map((s) => rt.run(s)));
    expect(raws.map((r) => r.stdout)).toEqual(['1\n', '2\n']);
    const patches = fake.apiCalls(from).filter((r) => r.method === 'PATCH' && /\/jobs\/[^/]+$/.test(r.path));
    expect(patches).toHaveLength(2);
    expect(fake.attaches.filter((x) => x.container === 'collector').every((x) => x.stdin.length > 0)).toBe(true);
    expect(new Set(fake.attaches.map((x) => x.pod)).size).toBe(2);
  });

  it('a restarted service adopts its idle pool; a JobType change replaces it; a deleted JobType removes it', async () => {
    const first = await start();
    await fake.waitFor(() => poolReady(), 20_000, 'ready');
    const names = readyIdle().map((j) => j.metadata.name).sort();
    await first.stop();
    runtimes.splice(runtimes.indexOf(first), 1);
    const second = await start();
    // Adopted: the same Jobs stay, none is added.
    await new Promise((r) => setTimeout(r, 300));
    expect(idle().map((j) => j.metadata.name).sort()).toEqual(names);
    const raw = await second.run(spec({ code: 'print("adopted")' }));
    expect(raw.stdout).toBe('adopted\n');
    expect(second.warmPoolStats!()[0]).toMatchObject({ hits: 1 });
    // The JobType changes (a new env value): idle pods of the old spec are replaced.
    types = [jobType({ env: { A: 'b' } })];
    await fake.waitFor(() => readyIdle().length === 2 && readyIdle().every((j) => !names.includes(j.metadata.name)), 20_000, 'replaced');
    const env = await second.run(spec({ jobType: types[0]!, code: 'import os\nprint(os.environ["A"])' }));
    expect(env.stdout).toBe('b\n');
    // Deleted: the pool goes.
    types = [];
    await fake.waitFor(() => idle().length === 0, 5000, 'pool removed');
  });

  it('cold_start attach: a miss makes the run its own pool-style pod and hands the program over once main runs', async () => {
    const rt = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const s = spec({ code: 'import sys\nprint("cold", file=sys.stderr)\nsys.exit(4)' });
    const raw = await rt.run(s);
    expect(raw.observation).toMatchObject({ exitCode: 4, phase: 'failed', infraError: null });
    expect(raw.stderr).toBe('cold\n');
    const job = fake.list('jobs', NS).find((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId)!;
    expect(job.metadata.name).toBe(`sp-${s.executionId}`);
    expect(job.spec.template.spec.containers.find((c: { name: string }) => c.name === 'collector').stdin).toBe(true);
    expect(fake.list('secrets', NS)).toEqual([]);
    expect(fake.attaches.filter((a) => a.pod.startsWith(job.metadata.name))).toHaveLength(1);
  });

  it('counts the timeout from delivery and reports a miss when no pod is ready', async () => {
    const rt = await start({ warm_pool_max_idle_seconds: 3600 });
    await fake.waitFor(() => poolReady(), 20_000, 'ready');
    // Idle pods that waited long already: the run's 1 s limit still holds from the hand-over.
    await new Promise((r) => setTimeout(r, 1200));
    const raw = await rt.run(spec({ timeoutSec: 1, code: 'import time\nprint("start", flush=True)\ntime.sleep(5)' }));
    expect(raw.report?.timed_out).toBe(true);
    expect(raw.stdout).toBe('start\n');
    // The runner's clock starts before its `execution` line reaches the service (a loaded machine
    // delays that relay by 100 ms and more): the bound only shows the limit was not counted from the
    // pod's start, which `start` in stdout already proves.
    expect(raw.observation.executionMs).toBeGreaterThanOrEqual(500);
    expect(raw.observation.executionMs).toBeLessThan(3000);
    // A run with requirements never takes a pool pod: counted as a miss, and its Job is the cold one.
    const s = spec({ requirements: ['six'] });
    const running = rt.run(s);
    running.catch(() => undefined);
    await fake.waitFor(() => fake.list('jobs', NS).some((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId && !j.metadata.labels?.[POOL_LABELS.pool]), 2000, 'cold Job');
    expect(rt.warmPoolStats!()[0]).toMatchObject({ hits: 1, misses: 1 });
  });

  it('a hand-over cut before the program started is retried on another pool pod, transparently, and counted', async () => {
    const rt = await start();
    await fake.waitFor(() => poolReady(), 20_000, 'ready');
    const first = readyIdle().map((j) => j.metadata.name);
    fake.attachDropsBeforeStdin = 1;
    const s = spec({ code: 'print("ran")' });
    const raw = await rt.run(s);
    expect(fake.attachDropsBeforeStdin).toBe(0);
    // Nothing of the program ran on the first pod; the run went on to another and succeeded.
    expect(raw.observation.infraError).toBeNull();
    expect(raw.stdout).toBe('ran\n');
    const attached = fake.attaches.map((a) => a.pod);
    expect(attached).toHaveLength(2);
    expect(new Set(attached).size).toBe(2);
    // The pod whose hand-over failed is gone, not returned to the pool.
    const cut = fake.list('pods', NS).find((p) => p.metadata.name === attached[0]);
    expect(!cut || !!cut.metadata.deletionTimestamp).toBe(true);
    expect(first.some((n) => attached[0]!.startsWith(n))).toBe(true);
    expect(rt.warmPoolStats!().find((x) => x.job_type === 'default')).toMatchObject({ hits: 2, handover_retries: 1 });
  });

  it('two failed hand-overs: the run starts cold and still succeeds', async () => {
    const rt = await start({ cold_start: 'attach' });
    await fake.waitFor(() => poolReady(), 20_000, 'ready');
    fake.attachDropsBeforeStdin = 2;
    const s = spec({ code: 'print("cold after all")' });
    const raw = await rt.run(s);
    expect(raw.observation.infraError).toBeNull();
    expect(raw.stdout).toBe('cold after all\n');
    // The run's own Job (named after the execution) ran it.
    expect(fake.list('jobs', NS).some((j) => j.metadata.name === `sp-${s.executionId}`)).toBe(true);
    expect(rt.warmPoolStats!().find((x) => x.job_type === 'default')).toMatchObject({ handover_retries: 2 });
  });

  it('cold_start attach: a retry that finds its own failed attempt’s Job removes it and goes on in the same attempt', async () => {
    // The failure seen on kcluster: a cold attach pod's hand-over failed, the service retried at once
    // (its informer had not yet heard the Job's deletion), found that Job (nothing handed over), deleted
    // it and threw, using up the last attempt of a sync run.
    const rt = await start({ warm_pool_size: 0, cold_start: 'attach' });
    fake.attachDropsBeforeStdin = 1;
    const s = spec({ code: 'print("second try")' });
    await expect(rt.run(s)).rejects.toThrow();
    const firstUid = fake.list('jobs', NS).find((j) => j.metadata.name === `sp-${s.executionId}`)?.metadata.uid;
    // The retry, before this process saw the first Job go.
    const raw = await rt.run(s);
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe('second try\n');
    // It ran on a Job of its own, made after the first was gone; the first attempt's late delete (by
    // uid) did not take it.
    const jobs = fake.list('jobs', NS).filter((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId);
    expect(jobs).toHaveLength(1);
    expect(jobs[0]!.metadata.uid).not.toBe(firstUid);
    const attached = fake.attaches.filter((a) => a.pod.startsWith(`sp-${s.executionId}`)).map((a) => a.pod);
    expect(new Set(attached).size).toBe(2);
  });

  it('cold_start attach: a collector whose stdin closed at its start fails the attempt at once (not at the startup limit), and the retry runs the program once', async () => {
    // Seen on kcluster under gVisor: the collector read EOF as it started, the attach's bytes sat in
    // its stdin pipe, and the run waited out its 300 s startup limit.
    const rt = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const s = spec({ code: 'print("ran")', startupTimeoutSec: 60 });
    fake.collectorStdinClosedJobs.add(`sp-${s.executionId}`);
    const t0 = Date.now();
    await expect(rt.run(s)).rejects.toThrow(/stdin closed before the program came/);
    expect(Date.now() - t0).toBeLessThan(10_000);
    // The first pod never got the program (its main printed nothing); its Job goes.
    const first = fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId)!;
    expect(fake.logOf(first.metadata.name, 'collector')).toBe('undelivered stdin closed before the program came\n');
    expect(fake.logOf(first.metadata.name, 'main')).toBe('');
    await fake.waitFor(() => !fake.list('pods', NS).some((p) => p.metadata.name === first.metadata.name && !p.metadata.deletionTimestamp), 5000, 'the first pod deleted');
    const raw = await rt.run(s);
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe('ran\n');
  });

  it('cold_start attach: a collector that ended before the attach while its status still says running fails the attempt at once, for what it is', async () => {
    // The container runtime refuses an attach to an ended container; the kubelet reports the end at
    // its next sync. The refusal is not taken for the cause: the status, a moment later, says it.
    const rt = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const s = spec({ code: 'print("ran")', startupTimeoutSec: 60 });
    fake.collectorStdinClosedJobs.add(`sp-${s.executionId}`);
    fake.collectorEndLagMs = 1500;
    // The service's attach reaches the server only once the collector has ended.
    fake.hang({ path: /\/attach$/ });
    const t0 = Date.now();
    try {
      const running = rt.run(s);
      running.catch(() => undefined);
      const pod = () => fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId)?.metadata.name ?? '';
      await fake.waitFor(() => !!pod() && fake.logOf(pod(), 'collector').includes('undelivered') && !fake.processAlive(pod(), 'collector'), 5000, 'the collector ended');
      fake.clearHang();
      await expect(running).rejects.toThrow(/stdin closed before the program came/);
    } finally {
      fake.clearHang();
      fake.collectorEndLagMs = 0;
    }
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(fake.attachRefusals).toBeGreaterThan(0);
  });

  it('cold_start attach: the hand-over waits for a runner slow to start as long as the run’s startup limit allows', async () => {
    // On a loaded node `main`'s runner can start well after the collector took the program: the
    // hand-over's own limit (here 500 ms, 30 s by default) must not fail the attempt before the
    // run's startup limit does.
    const rt = await startRuntime(fake, {
      config: testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, warm_pool_size: 0, cold_start: 'attach' } }),
      options: { runnerSource, jobTypes: () => types, tuning: { podGoneGraceMs: 150, execTimeoutMs: 5000, informerBackoffInitialMs: 20, informerBackoffMaxMs: 200, healthCacheMs: 0, handOverTimeoutMs: 500 } },
    });
    runtimes.push(rt);
    fake.mainStartDelayMs = 2000;
    const raw = await rt.run(spec({ code: 'print("late runner")', startupTimeoutSec: 30 }));
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe('late runner\n');
    expect(raw.observation.startupMs).toBeGreaterThanOrEqual(1500);
  });

  it('adoption after the handing process died: a pod that never got its program goes and the run starts again; a handed-over one is followed to its end', async () => {
    // What a process that died between creating an attach pod and handing the program over left:
    // the pod, waiting for a go line that will never come.
    const second = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const lost = spec({ code: 'print("never")' });
    const cfg = testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5 } });
    const job = coldAttachJob(lost, cfg, { name: `sp-${lost.executionId}`, runtimeClassName: 'gvisor', sources: SOURCES, graceSec: 5 });
    await createAttachJob((second as unknown as { internals: { api: KubeApi } }).internals.api, job);
    await fake.waitFor(() => fake.list('pods', NS).some((p) => p.metadata.labels?.[LABELS.executionId] === lost.executionId && p.status?.containerStatuses?.some((c: { name: string; state?: { running?: unknown } }) => c.name === 'collector' && c.state?.running)), 5000, 'the orphaned pod running');
    // Adopted: it goes (nothing of the program ran), and the service starts the run again.
    await expect(second.run(lost, { adopt: true })).rejects.toBeInstanceOf(RunGoneError);
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === `sp-${lost.executionId}` && !j.metadata.deletionTimestamp), 5000, 'the undelivered Job deleted');
    // A run whose program did reach its pod is adopted and followed to its end.
    const slow = spec({ code: 'import time\ntime.sleep(1.5)\nprint("adopted after hand-over")' });
    const going = second.run(slow);
    going.catch(() => undefined);
    await fake.waitFor(() => fake.list('pods', NS).some((p) => p.metadata.labels?.[LABELS.executionId] === slow.executionId && fake.logOf(p.metadata.name, 'collector').includes('execution')), 5000, 'handed over');
    await second.stop();
    runtimes.splice(runtimes.indexOf(second), 1);
    const third = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const raw = await third.run(slow, { adopt: true });
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe('adopted after hand-over\n');
  });

  it.each([
    ['', 0],
    [', its fence exec failing at first (a starved kubelet): asked again, not taken for "never reached"', 3],
    [', its pod not in the new holder\'s cache yet (a lagging watch): the API server asked', 0, true],
  ])('adoption while a stale holder\'s hand-over is in flight (its runner not up yet): the new holder fences the pod, and the program never runs there%s', async (_what, fenceFailures, lagging = false) => {
    // A holder that stalled (or died) with the program on its way: the collector has it, main's
    // runner is not listening yet. The log says nothing of a start, as for a pod never reached; only
    // the claim tells them apart. The new holder fences the pod; should the pod outlive that (its
    // delete fails here), the runner that comes up later gets no go line and nothing runs.
    const second = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const api = (second as unknown as { internals: { api: KubeApi } }).internals.api;
    fake.mainStartDelayMs = 2500;
    const dir = mkdtempSync(path.join(tmpdir(), 'fence-'));
    const ran = path.join(dir, 'ran');
    const stale = spec({ code: `open(${JSON.stringify(ran)}, "w").write("x")\nprint("ran")` });
    const cfg = testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5 } });
    const job = coldAttachJob(stale, cfg, { name: `sp-${stale.executionId}`, runtimeClassName: 'gvisor', sources: SOURCES, graceSec: 5 });
    if (lagging) fake.holdEvents();
    await createAttachJob(api, job);
    const podName = () => fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === stale.executionId)?.metadata.name;
    await fake.waitFor(() => !!podName() && fake.list('pods', NS).some((p) => p.metadata.name === podName() && p.status?.containerStatuses?.some((c: { name: string; state?: { running?: unknown } }) => c.name === 'collector' && c.state?.running)), 5000, 'the collector running');
    const pod = podName()!;
    // The stale holder's bytes: the whole program, sent before it stalled.
    const attach = await api.attach(NS, pod, 'collector', () => undefined);
    await attach.send(handOverPayload({ code: stale.code, inputJson: stale.inputJson, timeoutSec: stale.timeoutSec, maxStdoutBytes: stale.maxStdoutBytes }));
    await fake.waitFor(() => existsSync(path.join(path.dirname(fake.outputDir(pod)), 'code', 'main.py')), 5000, 'the program written by the collector');
    // The new holder's delete of the Job fails (the pod outlives the adoption).
    fake.failNext(new RegExp(`/jobs/sp-${stale.executionId}$`), 500, 10, 'DELETE');
    failFences(fenceFailures);
    await expect(second.run(stale, { adopt: true })).rejects.toBeInstanceOf(RunGoneError);
    expect(readlinkSync(path.join(path.dirname(fake.outputDir(pod)), 'control', 'claim'))).toBe('fence');
    // The runner comes up; the collector, finding the claim taken, sends no go line: nothing runs.
    await fake.waitFor(() => fake.logOf(pod, 'collector').includes('undelivered fenced'), 10_000, 'the collector refusing the stale hand-over');
    expect(existsSync(ran)).toBe(false);
    expect(fake.logOf(pod, 'main')).toBe('');
    attach.close();
    fake.mainStartDelayMs = 0;
    fake.releaseEvents();
  });

  it.each([
    ['cold', 0],
    ['warm', 2],
  ])('a run given back (the service stops) while the attach to its %s pod is still opening sends nothing on it: the program never runs there', async (_path, poolSize) => {
    // Under load an attach takes seconds to open; the run may be given back meanwhile, and its next
    // holder may have asked the pod's claim before the collector ran. The attach, once open, must
    // not carry the program: the collector ends with none (exit 3) and the next holder starts afresh.
    const rt = await start({ warm_pool_size: poolSize, cold_start: 'attach' });
    if (poolSize > 0) await fake.waitFor(poolReady, 15_000, 'the pool ready');
    const { s, ledger, going } = await givenBackWithAttachHeld(rt);
    await fake.waitFor(() => fake.list('pods', NS).some((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId), 5000, 'the run\'s pod labelled');
    const pod = fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId)!.metadata.name as string;
    // The attach opens now, after the run was given back (a warm run learns of it only then).
    fake.clearHang();
    await expect(going).rejects.toBeInstanceOf(LeftRunningError);
    await fake.waitFor(() => !fake.processAlive(pod, 'collector'), 10_000, 'the collector ended');
    await new Promise((r) => setTimeout(r, 1000)); // a program handed over would have written by now
    expect(existsSync(ledger)).toBe(false);
    expect(fake.logOf(pod, 'collector')).not.toMatch(/^execution$/m);
    // The Job stays for the next holder, which finds a pod that ran nothing.
    expect(fake.list('jobs', NS).some((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId && !j.metadata.deletionTimestamp)).toBe(true);
  });

  it('a run given back while its attach is held, the attach then refused (the collector not started yet): the Job and its pod stay for the next holder, unfenced', async () => {
    // On a loaded node the attach goes out as soon as the pod is bound, and may be answered only
    // after the run was given back, with a refusal (the collector not running yet). That refusal says
    // nothing about a run no longer this process's: it must not fence the pod or delete the Job that
    // the next holder re-attaches to.
    fake.podStartDelayMs = 3000;
    const rt = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const { s, ledger, going } = await givenBackWithAttachHeld(rt);
    await expect(going).rejects.toBeInstanceOf(LeftRunningError);
    const pod = fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId)!.metadata.name as string;
    const refused = fake.attachRefusals;
    fake.clearHang();
    await fake.waitFor(() => fake.attachRefusals > refused, 5000, 'the held attach refused');
    await fake.waitFor(() => fake.processAlive(pod, 'collector'), 10_000, 'the collector started');
    await new Promise((r) => setTimeout(r, 1000)); // a fence and a delete would have come by now
    expect(existsSync(path.join(path.dirname(fake.outputDir(pod)), 'control', 'claim'))).toBe(false);
    expect(fake.list('jobs', NS).some((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId && !j.metadata.deletionTimestamp)).toBe(true);
    expect(fake.list('pods', NS).some((p) => p.metadata.name === pod && !p.metadata.deletionTimestamp)).toBe(true);
    expect(existsSync(ledger)).toBe(false);
  });

  it('a stale attempt (its process was taken over) that finds the new holder\'s Job, its program not handed over yet, leaves it alone', async () => {
    // The new holder made its Job and is about to hand the program over; the old holder, resumed and
    // not yet told, retries: it must neither fence nor delete that Job.
    const rt = await start({ warm_pool_size: 0, cold_start: 'attach' });
    const api = (rt as unknown as { internals: { api: KubeApi } }).internals.api;
    const s = spec({ code: 'print("new holder")' });
    const cfg = testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5 } });
    await createAttachJob(api, coldAttachJob(s, cfg, { name: `sp-${s.executionId}`, runtimeClassName: 'gvisor', sources: SOURCES, graceSec: 5 }));
    const podName = () => fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId)?.metadata.name;
    await fake.waitFor(() => !!podName() && fake.list('pods', NS).some((p) => p.metadata.name === podName() && p.status?.containerStatuses?.some((c: { name: string; state?: { running?: unknown } }) => c.name === 'collector' && c.state?.running)), 5000, 'the collector running');
    // The runtime's informer has the Job (its events come within milliseconds here).
    await new Promise((r) => setTimeout(r, 500));
    await expect(rt.run(s, { confirmHeld: async () => false })).rejects.toBeInstanceOf(FencedError);
    expect(fake.list('jobs', NS).some((j) => j.metadata.name === `sp-${s.executionId}` && !j.metadata.deletionTimestamp)).toBe(true);
    expect(existsSync(path.join(path.dirname(fake.outputDir(podName()!)), 'control', 'claim'))).toBe(false);
  });

  it('a run claimed again (earlierAttempts) finds an earlier attempt\'s claimed pool Job its cache has not seen, and follows it: the program runs once', async () => {
    // A replica stopped and left its warm run's pod running for the next holder; the next holder's
    // informer has not seen that claim yet. The claimed pool Job has a name of its own, so nothing
    // else would meet it: without the API server's answer the run would start in a second pod.
    const second = await start({ warm_pool_size: 1, cold_start: 'attach' });
    await fake.waitFor(() => readyIdle().length === 1 && (second.warmPoolStats!().find((x) => x.job_type === 'default')?.ready ?? 0) >= 1, 15_000, 'the pool ready');
    const third = await start({ warm_pool_size: 1, cold_start: 'attach' });
    await new Promise((r) => setTimeout(r, 500)); // its informer has listed everything
    const s = spec({ code: 'import time\ntime.sleep(1.5)\nprint("once")' });
    fake.holdEvents();
    try {
      const going = second.run(s);
      going.catch(() => undefined);
      await fake.waitFor(() => fake.list('pods', NS).some((p) => p.metadata.labels?.[LABELS.executionId] === s.executionId && fake.logOf(p.metadata.name, 'collector').includes('execution')), 10_000, 'handed over');
      await second.stop();
      runtimes.splice(runtimes.indexOf(second), 1);
      const before = fake.requests.length;
      const raw = third.run(s, { earlierAttempts: true });
      await fake.waitFor(() => fake.requests.slice(before).some((r) => r.method === 'GET' && r.path.endsWith('/jobs') && !r.watch), 5000, 'the API server asked');
      fake.releaseEvents();
      const result = await raw;
      expect(result.stdout).toBe('once\n');
    } finally {
      fake.releaseEvents();
    }
    expect(fake.list('jobs', NS).filter((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId)).toHaveLength(1);
  });

  it.each([
    ['', 0],
    [', with its fence exec failing at first', 2],
  ])('a warm hand-over that fails after its bytes went (no answer in time) never runs the program twice: the pod is followed when it started, fenced when not%s', async (_what, fenceFailures) => {
    failFences(fenceFailures);
    const rt = await startRuntime(fake, {
      config: testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, warm_pool_size: 2, cold_start: 'attach' } }),
      options: { runnerSource, jobTypes: () => types, tuning: { podGoneGraceMs: 150, execTimeoutMs: 5000, informerBackoffInitialMs: 20, informerBackoffMaxMs: 200, healthCacheMs: 0, poolIntervalMs: 50, handOverTimeoutMs: 1 } },
    });
    runtimes.push(rt);
    await fake.waitFor(poolReady, 15_000, 'the pool ready');
    const ledger = path.join(mkdtempSync(path.join(tmpdir(), 'ledger-')), 'ran');
    const s = spec({ code: `open(${JSON.stringify(ledger)}, "a").write("x")\nprint("once")`, startupTimeoutSec: 30 });
    const raw = await rt.run(s);
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe('once\n');
    await new Promise((r) => setTimeout(r, 1000)); // a program started in a pod given up would have written by now
    expect(readFileSync(ledger, 'utf8')).toBe('x');
  });

  it('pool pods that cannot pull their image are removed at once and replaced after a back-off', async () => {
    fake.unpullable.add('sandpod/executor:test');
    const seen = new Set<string>();
    const poll = setInterval(() => {
      for (const j of poolJobs()) seen.add(j.metadata.name);
    }, 5);
    try {
      const rt = await start({ warm_pool_max_idle_seconds: 3600 });
      // The first two wait in ImagePullBackOff: failed now, removed, not left holding the pool for an hour.
      await fake.waitFor(() => seen.size === 2 && poolJobs().length === 0, 5000, 'the failed pool Jobs removed');
      // Within the back-off (2 s after the first failures) no new pool Job churns.
      await new Promise((r) => setTimeout(r, 1000));
      expect(seen.size).toBe(2);
      // The image becomes pullable: after the back-off the pool fills and a run is a hit.
      fake.unpullable.clear();
      await fake.waitFor(() => poolReady(), 20_000, 'pool refilled after the back-off');
      const raw = await rt.run(spec({ code: 'print("ok")' }));
      expect(raw.stdout).toBe('ok\n');
      expect(rt.warmPoolStats!()[0]).toMatchObject({ hits: 1, misses: 0 });
    } finally {
      clearInterval(poll);
    }
  });

  it('a pool Job create whose answer was lost (the API server stored it) is not made twice', async () => {
    // Every create's answer is lost, its retries' too (they find the Job and are refused 409 first),
    // and the informer shows nothing new meanwhile (events held): as a loaded API server that answers
    // late. The pool must count the Jobs it may have made, not make more.
    fake.holdEvents();
    fake.failNext(/\/apis\/batch\/v1\/namespaces\/[^/]+\/jobs$/, 500, 40, 'POST', { afterCommit: true });
    const seen = new Set<string>();
    const poll = setInterval(() => {
      for (const j of poolJobs()) seen.add(j.metadata.name);
    }, 5);
    try {
      await start();
      await fake.waitFor(() => poolJobs().length >= 2, 5000, 'the pool Jobs made');
      // Many pool passes (50 ms apart) while the informer still shows none of them.
      await new Promise((r) => setTimeout(r, 1000));
      expect(seen.size).toBe(2);
      fake.releaseEvents();
      await fake.waitFor(() => poolReady(), 20_000, 'the pool ready');
      expect(seen.size).toBe(2);
    } finally {
      clearInterval(poll);
    }
  });

  it('cold_start attach hands the program over before the kubelet reports main running (attach asks the runtime)', async () => {
    const rt = await start({ warm_pool_size: 0, cold_start: 'attach' });
    // The status of a started main trails by 3 s here; the runtime itself knows at once.
    fake.statusLagMs = 3000;
    const t0 = performance.now();
    const raw = await rt.run(spec({ code: 'print("early")' }));
    const wall = performance.now() - t0;
    expect(raw.stdout).toBe('early\n');
    expect(raw.observation.infraError).toBeNull();
    // Startup lasts until the hand-over: long before the status said running (3 s without this).
    expect(raw.observation.startupMs).toBeLessThan(1500);
    // And the outputs were pulled from the collector, started with main, before its status said so
    // too: the run is answered long before the 3 s.
    expect(wall).toBeLessThan(1500);
  });
});
