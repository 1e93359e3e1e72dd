/**
 * Three replicas of the Kubernetes runtime against one fake API server (issue 20): one leads (the
 * Lease), only the leader creates and removes pool Jobs so the pool never exceeds its size, every
 * replica claims pool pods and runs programs, each run ends exactly once, and when the leader stops
 * another takes over and keeps the pool filled. The orphan sweep is the leader's alone.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { JobType } from '../../../src/jobtypes/job-type.ts';
import { KubeApi } from '../../../src/kube/kube-api.ts';
import { POOL_LABELS } from '../../../src/runtime/kubernetes/pool/pool-plan.ts';
import { executionLabel, LABELS } from '../../../src/runtime/kubernetes/names.ts';
import { FencedError, type Runtime, type RunSpec } from '../../../src/runtime/runtime.ts';
import { RUNNER_PATH } from '../../../src/sandbox/paths.ts';
import { FakeKube, jobType, spec, startRuntime, testConfig } from '../../support/kube-runtime.ts';

const NS = 'sandpod-jobs';
const runnerSource = readFileSync(RUNNER_PATH, 'utf8');
let fake: FakeKube;
let types: JobType[];
let replicas: Runtime[] = [];
const live = new Set<string>();

async function replica(identity: string): Promise<Runtime> {
  const rt = await startRuntime(fake, {
    config: testConfig({
      kubernetes: {
        executor_image: 'sandpod/executor:test',
        deadline_grace_seconds: 5,
        preflight: false,
        warm_pool_size: 2,
        leader_election: { lease_name: 'sandpod-leader', lease_duration_seconds: 3, renew_deadline_seconds: 2, retry_period_seconds: 0.25 },
      },
    }),
    options: {
      identity,
      runnerSource,
      jobTypes: () => types,
      hooks: { liveExecutionIds: async (ids) => new Set(ids.filter((id) => live.has(id))) },
      tuning: { podGoneGraceMs: 150, execTimeoutMs: 5000, informerBackoffInitialMs: 20, informerBackoffMaxMs: 200, healthCacheMs: 0, poolIntervalMs: 50, sweepIntervalMs: 200 },
    },
  });
  replicas.push(rt);
  return rt;
}

const unclaimedPool = () => fake.list('jobs', NS).filter((j) => j.metadata.labels?.[POOL_LABELS.pool] && !j.metadata.labels?.[LABELS.executionId] && !j.metadata.deletionTimestamp);
const readyIdle = () =>
  unclaimedPool().filter((j) => {
    const main = fake.podOfJob(j.metadata.name)?.status?.containerStatuses?.find((c: { name: string }) => c.name === 'main');
    return main?.state?.running && main.ready; // its startup probe passed
  });
const leaders = () => replicas.filter((r) => r.leadership!().leading);

/**
 * Plays the kubelet for cold run pods (the fake runs real programs only in pool pods): schedules
 * each, runs `main`, gives it the output `outputOf` says and ends it. Returns a stop function.
 */
function driveColdPods(outputOf: (executionLabel: string) => string): () => void {
  const done = new Set<string>();
  const t = setInterval(() => {
    for (const p of fake.list('pods', NS)) {
      const label = p.metadata.labels?.[LABELS.executionId];
      if (!label || p.metadata.labels?.[POOL_LABELS.pool] || done.has(p.metadata.name)) continue;
      done.add(p.metadata.name);
      fake.schedule(p.metadata.name);
      fake.mainRunning(p.metadata.name);
      fake.setOutput(p.metadata.name, { phase: 'completed', stdout: outputOf(label), stderr: '', report: { phase: 'completed', exit_code: 0 } });
      fake.mainTerminated(p.metadata.name, 0);
    }
  }, 30);
  return () => clearInterval(t);
}

/** Samples the unclaimed pool size every 20 ms while `during` runs; returns the largest seen. */
async function maxPoolDuring(during: () => Promise<unknown>): Promise<number> {
  let max = 0;
  const t = setInterval(() => (max = Math.max(max, unclaimedPool().length)), 20);
  try {
    await during();
  } finally {
    clearInterval(t);
  }
  return Math.max(max, unclaimedPool().length);
}

beforeEach(async () => {
  fake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
  fake.addRuntimeClass('gvisor');
  types = [jobType()];
  live.clear();
});
afterEach(async () => {
  for (const rt of replicas.splice(0)) await rt.stop();
  await fake.close();
});

describe('three replicas (fake API server, real runner)', () => {
  it('one leads; the pool never exceeds its size; every replica claims and each run ends exactly once', async () => {
    await Promise.all(['r0', 'r1', 'r2'].map((id) => replica(id)));
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    const leader = leaders()[0]!.leadership!();
    expect(replicas.map((r) => r.leadership!().holder)).toEqual(expect.arrayContaining([leader.identity]));
    expect((await replicas[0]!.health()).detail?.leader).toMatchObject({ enabled: true, lease: 'sandpod/sandpod-leader' });

    const fill = await maxPoolDuring(() => fake.waitFor(() => readyIdle().length === 2, 20_000, 'two ready pool pods'));
    expect(fill).toBeLessThanOrEqual(2);
    // ... and every replica's informer has seen them ready (their startup probe passed last).
    await fake.waitFor(() => replicas.every((r) => r.warmPoolStats!().some((st) => st.ready === 2)), 20_000, 'every replica sees two ready');

    // Nine runs, three through each replica, at once: every one succeeds once, with its own output.
    const specs = Array.from({ length: 9 }, (_, i) => spec({ code: `print("run-${i}")` }));
    // Their records are live (not terminal) while they run, as the service's hooks would say.
    for (const s of specs) live.add(s.executionId);
    const index = new Map(specs.map((s, i) => [executionLabel(s.executionId), i]));
    const stopDriving = driveColdPods((label) => `run-${index.get(label)} (cold)\n`);
    let raws: Awaited<ReturnType<Runtime['run']>>[] = [];
    const burstMax = await maxPoolDuring(async () => {
      raws = await Promise.all(specs.map((s, i) => replicas[i % 3]!.run(s))).finally(stopDriving);
    });
    // Every run ended once and well, with its own output: warm hits ran the real program, cold
    // ones got what the kubelet stand-in gave them.
    expect(JSON.stringify(raws.map((r) => [r.observation.exitCode, r.observation.infraError]))).toBe(JSON.stringify(raws.map(() => [0, null])));
    const warm = raws.filter((r, i) => r.stdout === `run-${i}\n`).length;
    const cold = raws.filter((r, i) => r.stdout === `run-${i} (cold)\n`).length;
    expect(warm + cold).toBe(9);
    const hits = replicas.reduce((n, r) => n + r.warmPoolStats!().reduce((m, st) => m + st.hits, 0), 0);
    expect(warm).toBe(hits);
    expect(hits).toBeGreaterThanOrEqual(2);
    expect(burstMax).toBeLessThanOrEqual(2);
    for (const s of specs) {
      const jobs = fake.list('jobs', NS).filter((j) => j.metadata.labels?.[LABELS.executionId] === executionLabel(s.executionId));
      expect(jobs.length, s.executionId).toBe(1);
    }
    // Every replica claims pool pods for its own runs: once the pool is full again, a run through each
    // replica in turn is a warm hit there. (In the burst one replica may win both pods: its second run
    // skips the pod its first is claiming and takes the other at once, while the others lose a 409.)
    for (const [i, r] of replicas.entries()) {
      await fake.waitFor(() => readyIdle().length === 2 && r.warmPoolStats!().some((st) => st.ready === 2), 8000, `two ready pool pods for r${i}`);
      const before = r.warmPoolStats!().reduce((n, st) => n + st.hits, 0);
      const one = spec({ code: `print("turn-${i}")` });
      live.add(one.executionId);
      const raw = await r.run(one);
      expect(raw.stdout, `r${i}`).toBe(`turn-${i}\n`);
      expect(r.warmPoolStats!().reduce((n, st) => n + st.hits, 0), `r${i}`).toBe(before + 1);
    }
  });

  it('when the leader steps down (a shutdown begins) it releases the Lease; another replica leads within a retry or two and keeps the pool filled', async () => {
    await Promise.all(['r0', 'r1', 'r2'].map((id) => replica(id)));
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    await fake.waitFor(() => readyIdle().length === 2, 20_000, 'two ready pool pods');
    const old = leaders()[0]!;
    const oldId = old.leadership!().identity;
    replicas = replicas.filter((r) => r !== old);
    const stoppedAt = Date.now();
    // What a SIGTERM does first (main.ts): the runs in flight drain afterwards, the Lease moves now.
    await old.stepDown!();
    expect(old.leadership!().leading).toBe(false);
    await fake.waitFor(() => leaders().length === 1, 3000, 'a new leader');
    const tookMs = Date.now() - stoppedAt;
    expect(leaders()[0]!.leadership!().identity).not.toBe(oldId);
    // Released, not expired: well under the 3 s lease duration.
    expect(tookMs).toBeLessThan(2500);
    // The new leader refills after claims.
    const two = [spec(), spec()];
    for (const s of two) live.add(s.executionId);
    const stopDriving = driveColdPods(() => 'cold\n');
    const runs = await Promise.all(two.map((s, i) => replicas[i]!.run(s))).finally(stopDriving);
    expect(runs.every((r) => r.observation.exitCode === 0)).toBe(true);
    const max = await maxPoolDuring(() => fake.waitFor(() => readyIdle().length === 2, 20_000, 'the pool refilled by the new leader'));
    expect(max).toBeLessThanOrEqual(2);
    await old.stop();
  });

  it('the orphan sweep runs on the leader only: a run Job whose execution is gone is deleted once a leader sweeps', async () => {
    types = [];
    await replica('r0');
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    // A follower that never leads (the Lease is held by r0) sweeps nothing.
    const follower = await replica('r1');
    expect(follower.leadership!().leading).toBe(false);
    const orphanId = 'dead0000-aaaa-4bbb-8ccc-000000000001';
    const liveId = 'live0000-aaaa-4bbb-8ccc-000000000002';
    live.add(liveId);
    for (const id of [orphanId, liveId]) {
      await new KubeApi(fake.kubeConfig()).createJob({
        metadata: { namespace: NS, name: `sp-${id.slice(0, 8)}`, labels: { [LABELS.executionId]: id, [LABELS.instance]: 'sandpod', 'app.kubernetes.io/managed-by': 'sandpod' }, annotations: { 'sandpod.io/execution-id': id } },
        spec: { template: { spec: { containers: [{ name: 'main', image: 'x' }], restartPolicy: 'Never' } } },
      });
    }
    await fake.waitFor(() => !fake.list('jobs', NS).some((j) => j.metadata.name === 'sp-dead0000'), 5000, 'the orphan swept');
    expect(fake.list('jobs', NS).some((j) => j.metadata.name === 'sp-live0000')).toBe(true);
    const deletes = fake.requests.filter((r) => r.method === 'DELETE' && r.path.includes('/jobs/sp-dead0000'));
    expect(deletes.length).toBeGreaterThanOrEqual(1);
  });

  /**
   * A program that appends its execution id to a ledger on the host (the fake runs pool pods' programs
   * as host processes), then works a while: the ledger says how many times it really ran.
   */
  function ledgered(ledger: string): RunSpec {
    const s = spec();
    s.code = `import time\nopen(${JSON.stringify(ledger)}, "a").write(${JSON.stringify(s.executionId)} + "\\n")\ntime.sleep(1.5)\nprint("done")`;
    live.add(s.executionId);
    return s;
  }

  /** Starts `s` on `rt` with an abort controller; resolves once the program runs. */
  async function startedOn(rt: Runtime, s: RunSpec): Promise<{ ac: AbortController; run: Promise<unknown> }> {
    const ac = new AbortController();
    let running!: () => void;
    const started = new Promise<void>((r) => (running = r));
    const run = rt.run(s, { signal: ac.signal, onPhase: (p) => p === 'execution' && running() });
    run.catch(() => undefined);
    // A run that ends before its program started fails the test at once (not at its timeout).
    await Promise.race([started, run.then((r) => Promise.reject(new Error(`the run ended before its program started: ${JSON.stringify(r.observation)}`)))]);
    return { ac, run };
  }

  /** Names of the pods labelled with an execution, sampled every 20 ms until the returned function is called. */
  function podsOf(s: RunSpec): () => Set<string> {
    const seen = new Set<string>();
    const sample = () => {
      for (const p of fake.list('pods', NS)) if (p.metadata.labels?.[LABELS.executionId] === executionLabel(s.executionId)) seen.add(p.metadata.name);
    };
    const t = setInterval(sample, 20);
    return () => {
      clearInterval(t);
      sample();
      return seen;
    };
  }

  it('a replica stalled mid-run is not run twice: the adopter re-attaches to its pod, and the stalled one, fenced, lets go without deleting it', async () => {
    await Promise.all(['r0', 'r1', 'r2'].map((id) => replica(id)));
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    await fake.waitFor(() => readyIdle().length === 2, 20_000, 'two ready pool pods');
    // r0's informer too: a claim it made before would miss and start a cold pod, which nothing here runs.
    await fake.waitFor(() => replicas[0]!.warmPoolStats!().some((st) => st.ready === 2), 20_000, 'r0 sees two ready');
    const ledger = path.join(mkdtempSync(path.join(tmpdir(), 'ledger-')), 'ran.log');
    const s = ledgered(ledger);
    const pods = podsOf(s);
    // r0 claims a warm pod and the program runs; then r0 stalls (its lease lapses) and r1 adopts the
    // run, as the service's sweep would.
    const first = await startedOn(replicas[0]!, s);
    const jobName = fake.list('jobs', NS).find((j) => j.metadata.labels?.[LABELS.executionId] === executionLabel(s.executionId))!.metadata.name;
    const adopted = replicas[1]!.run(s, { adopt: true });
    // r0 runs again and learns at its heartbeat that the run is r1's: it stops without touching the Job.
    first.ac.abort('fenced');
    await expect(first.run).rejects.toBeInstanceOf(FencedError);
    const raw = await adopted;
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe('done\n');
    // One pod, one run of the program, and r0 deleted nothing while r1 followed the run.
    expect([...pods()]).toHaveLength(1);
    expect(readFileSync(ledger, 'utf8')).toBe(`${s.executionId}\n`);
    const deletesBefore = fake.requests.filter((r) => r.method === 'DELETE' && r.path.endsWith(`/jobs/${jobName}`));
    expect(deletesBefore).toHaveLength(0);
  });

  /** The state of the `collector` container of `s`'s pod in the fake. */
  const collectorOf = (s: RunSpec) =>
    fake
      .list('pods', NS)
      .find((p) => p.metadata.labels?.[LABELS.executionId] === executionLabel(s.executionId))
      ?.status?.containerStatuses?.find((c: { name: string }) => c.name === 'collector')?.state;
  /** What was written to the collector of `s`'s pod by attach (the fake shows only an exec'd release in the pod's status). */
  const sentTo = (s: RunSpec) => {
    const pod = fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === executionLabel(s.executionId))?.metadata.name;
    return fake.attaches.filter((a) => a.pod === pod && a.container === 'collector').map((a) => Buffer.concat(a.stdin).toString('utf8')).join('');
  };

  it('a replica that dies after its run ended but before its record was written leaves the outputs to the replica that adopts it (holdRelease)', async () => {
    await Promise.all(['r0', 'r1'].map((id) => replica(id)));
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    await fake.waitFor(() => readyIdle().length === 2, 8000, 'two ready pool pods');
    const ledger = path.join(mkdtempSync(path.join(tmpdir(), 'ledger-')), 'ran.log');
    const s = ledgered(ledger);
    // r0's run ends (a warm pod: the outputs came on the attach) and r0 dies before it writes the
    // record: letGo is never called. Released at once, as before holdRelease, the collector would be
    // gone with the outputs, and r1 could only say "outputs lost".
    const first = await replicas[0]!.run(s, { holdRelease: true });
    expect(first.stdout).toBe('done\n');
    expect(first.letGo).toBeTypeOf('function');
    // Nothing went to the collector after the program (no `release` line): it still holds the outputs.
    await new Promise((r) => setTimeout(r, 300));
    expect(sentTo(s).endsWith(s.inputJson)).toBe(true);
    expect(collectorOf(s)?.running).toBeTruthy();
    await replicas[0]!.stop();
    // r1 adopts it, as the service's sweep would once r0's holder lease lapsed, and gets the outputs.
    const raw = await replicas[1]!.run(s, { adopt: true, holdRelease: true });
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect(raw.stdout).toBe('done\n');
    expect(readFileSync(ledger, 'utf8')).toBe(`${s.executionId}\n`);
    // Still held until r1's record is written; then released (by exec: r1 has no attach to it).
    expect(collectorOf(s)?.running).toBeTruthy();
    raw.letGo!();
    await fake.waitFor(() => !!collectorOf(s)?.terminated, 5000, 'the collector released');
  });

  it('a held run lets its collector go on letGo, by the attach its outputs came on; without holdRelease at once', async () => {
    await replica('r0');
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    await fake.waitFor(() => readyIdle().length === 2, 8000, 'two ready pool pods');
    const held = spec({ code: 'print("held")' });
    live.add(held.executionId);
    const raw = await replicas[0]!.run(held, { holdRelease: true });
    expect(raw.stdout).toBe('held\n');
    // Ended, and its outputs taken, but the collector is not let go: nothing more went to it.
    await new Promise((r) => setTimeout(r, 300));
    expect(sentTo(held).endsWith(held.inputJson)).toBe(true);
    expect(collectorOf(held)?.running).toBeTruthy();
    raw.letGo!();
    await fake.waitFor(() => sentTo(held).endsWith(held.inputJson + 'release\n'), 5000, 'the release line on the attach');
    // The outputs came on the attach, and so did the release: no exec into the pod at all (no collect either).
    const heldPod = fake.list('pods', NS).find((p) => p.metadata.labels?.[LABELS.executionId] === executionLabel(held.executionId))!.metadata.name;
    expect(fake.execs.filter((e) => e.pod === heldPod)).toEqual([]);
    // Without the option the collector goes with the run's end, as before.
    await fake.waitFor(() => readyIdle().length >= 1, 8000, 'a ready pool pod');
    const plain = spec({ code: 'print("plain")' });
    live.add(plain.executionId);
    const other = await replicas[0]!.run(plain);
    expect(other.letGo).toBeUndefined();
    await fake.waitFor(() => sentTo(plain).endsWith(plain.inputJson + 'release\n'), 5000, 'the release line at once');
  });

  it('a fresh attempt of an execution whose pod still runs (given back to the queue meanwhile) re-attaches to it instead of claiming a second pod', async () => {
    await Promise.all(['r0', 'r1', 'r2'].map((id) => replica(id)));
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    await fake.waitFor(() => readyIdle().length === 2, 20_000, 'two ready pool pods');
    // r0's informer too: a claim it made before would miss and start a cold pod, which nothing here runs.
    await fake.waitFor(() => replicas[0]!.warmPoolStats!().some((st) => st.ready === 2), 20_000, 'r0 sees two ready');
    const ledger = path.join(mkdtempSync(path.join(tmpdir(), 'ledger-')), 'ran.log');
    const s = ledgered(ledger);
    const pods = podsOf(s);
    const first = await startedOn(replicas[0]!, s);
    // The run as another replica claims it from the queue: not an adoption, a new attempt.
    const again = replicas[2]!.run(s);
    first.ac.abort('fenced');
    await expect(first.run).rejects.toBeInstanceOf(FencedError);
    const raw = await again;
    expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
    expect([...pods()]).toHaveLength(1);
    expect(readFileSync(ledger, 'utf8')).toBe(`${s.executionId}\n`);
    // The second warm pod was not claimed.
    expect(replicas[2]!.warmPoolStats!().reduce((n, st) => n + st.hits, 0)).toBe(0);
  });

  it('a replica taken over before it started anything starts nothing: no claim, no Job', async () => {
    await Promise.all(['r0', 'r1'].map((id) => replica(id)));
    await fake.waitFor(() => leaders().length === 1, 5000, 'a leader');
    await fake.waitFor(() => readyIdle().length === 2, 20_000, 'two ready pool pods');
    const s = spec();
    live.add(s.executionId);
    await expect(replicas[0]!.run(s, { confirmHeld: async () => false })).rejects.toBeInstanceOf(FencedError);
    expect(fake.list('jobs', NS).filter((j) => j.metadata.labels?.[LABELS.executionId] === executionLabel(s.executionId))).toHaveLength(0);
    expect(readyIdle()).toHaveLength(2);
  });
});
