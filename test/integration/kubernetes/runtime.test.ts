import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UnretryableError } from '../../../src/errors.ts';
import { KubeApi } from '../../../src/kube/kube-api.ts';
import { CircuitBreaker } from '../../../src/resilience/breaker.ts';
import { withRetry } from '../../../src/resilience/retry.ts';
import { classify } from '../../../src/executions/classify.ts';
import { RunGoneError, type Runtime } from '../../../src/runtime/runtime.ts';
import { FAST_TUNING, FakeKube, jobNameFor, podOf, spec, startRuntime, testConfig } from '../../support/kube-runtime.ts';

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

describe('kubernetes runtime against the fake API server', () => {
  it('runs to success: Job + Secret created, phases reported, outputs collected, collector released', async () => {
    const s = spec();
    const phases: string[] = [];
    const before = fake.requests.length;
    const running = rt.run(s, { onPhase: (p) => phases.push(p) });
    const pod = await podOf(fake, s);
    fake.schedule(pod);
    fake.mainRunning(pod);
    await fake.waitFor(() => phases.includes('execution'), 2000, 'execution phase');
    fake.setOutput(
      pod,
      ({
        phase: 'completed',
        stdout: 'hi\n',
        stderr: '',
        report: { phase: 'completed', exit_code: 0, execution_ms: 12 },
        result: '{"answer": 42}',
        files: { 'plot.png': Buffer.from([0x89, 0x50]), 'sub/data.csv': 'a,b\n1,2\n' },
      }),
    );
    fake.mainTerminated(pod, 0);
    const raw = await running;
    expect(raw.observation).toMatchObject({ exitCode: 0, timedOut: null, oomKilled: false, cancelled: false, infraError: null, phase: 'completed' });
    expect(raw.stdout).toBe('hi\n');
    expect(raw.report).toMatchObject({ exit_code: 0, execution_ms: 12 });
    expect(raw.resultJson).toBe('{"answer": 42}');
    expect(raw.artifacts.map((a) => a.name).sort()).toEqual(['plot.png', 'sub']);
    expect(raw.artifacts.find((a) => a.name === 'sub')).toMatchObject({ skipped: 'not_regular' });
    expect(raw.artifacts.find((a) => a.name === 'plot.png')).toMatchObject({ contentType: 'image/png', size: 2 });
    expect(raw).toMatchObject({ artifactsTotal: 2, artifactsTruncated: false });
    // The Secret is owned by the Job, so the Job's deletion (or TTL) removes it.
    const job = fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))!;
    const secret = fake.get('secrets', 'sandpod-jobs', jobNameFor(s.executionId))!;
    expect(secret.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'Job', uid: job.metadata.uid });
    expect(job.spec.template.spec.runtimeClassName).toBe('gvisor');
    // Collector released: the pod completes and the Job with it.
    await fake.waitFor(() => fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))?.status?.conditions?.[0]?.type === 'Complete', 2000, 'job complete');
    const calls = fake.apiCalls(before).map((r) => `${r.method} ${r.path}`);
    expect(calls.length).toBeLessThanOrEqual(8);
  });

  it('a run reports once its outputs are in, without waiting for the release exec (sent all the same)', async () => {
    const s = spec();
    const before = fake.execs.length;
    // The release exec answers only after 3 s; the run must not wait for it.
    fake.onExec((call) => (call.command.join(' ').includes('/control/release') ? { delayMs: 3000 } : undefined));
    try {
      const running = rt.run(s);
      const pod = await podOf(fake, s);
      fake.schedule(pod);
      fake.mainRunning(pod);
      fake.setOutput(pod, { phase: 'completed', stdout: 'ok\n', report: { phase: 'completed', exit_code: 0 } });
      fake.mainTerminated(pod, 0);
      const t0 = performance.now();
      const raw = await running;
      expect(performance.now() - t0).toBeLessThan(2000);
      expect(raw.observation).toMatchObject({ exitCode: 0, phase: 'completed' });
      expect(raw.stdout).toBe('ok\n');
      await fake.waitFor(() => fake.execs.slice(before).some((e) => e.pod === pod && e.command.join(' ').includes('/control/release')), 2000, 'release exec');
    } finally {
      fake.onExec(null);
    }
  });

  it('a run writing 1,500 files: the first 1,000 by name listed, all counted, the list flagged, the result kept', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.schedule(pod);
    fake.mainRunning(pod);
    const files = Object.fromEntries(Array.from({ length: 1500 }, (_, i) => [`f${String(i).padStart(4, '0')}.txt`, `${i}`]));
    fake.setOutput(pod, { phase: 'completed', report: { phase: 'completed', exit_code: 0 }, result: '{"n": 1500}', files });
    fake.mainTerminated(pod, 0);
    const raw = await running;
    expect(raw).toMatchObject({ resultJson: '{"n": 1500}', artifactsTotal: 1500, artifactsTruncated: true });
    expect(raw.artifacts).toHaveLength(1000);
    expect(raw.artifacts.at(-1)).toMatchObject({ name: 'f0999.txt', size: 3 });
  });
});

describe('kubernetes runtime: failures and timeouts', () => {
  it('startup timeout when the pod stays unschedulable; the Job is deleted', async () => {
    const s = spec({ startupTimeoutSec: 0.3 });
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.unschedulable(pod);
    const raw = await running;
    expect(raw.observation).toMatchObject({ timedOut: 'startup', phase: 'startup', exitCode: null });
    await fake.waitFor(() => !fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId)), 2000, 'job deleted');
    await fake.waitFor(() => !fake.get('secrets', 'sandpod-jobs', jobNameFor(s.executionId)), 2000, 'secret collected');
  });

  it('startup timeout while dependencies install slowly', async () => {
    const s = spec({ startupTimeoutSec: 0.3, requirements: ['numpy'] });
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.schedule(pod);
    fake.depsRunning(pod);
    const raw = await running;
    expect(raw.observation).toMatchObject({ timedOut: 'startup', phase: 'startup' });
  });

  it('execution timeout from the runner: collected as usual, the report says timed_out', async () => {
    const s = spec({ timeoutSec: 1 });
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ phase: 'execution', stdout: 'partial', report: { timed_out: true, exit_code: null } }));
    fake.mainTerminated(pod, 124);
    const raw = await running;
    expect(raw.observation).toMatchObject({ exitCode: 124, timedOut: null, phase: 'failed' });
    expect(raw.report?.timed_out).toBe(true);
    expect(raw.stdout).toBe('partial');
  });

  it('execution timeout from the Job deadline backstop (pods deleted first, then DeadlineExceeded)', async () => {
    // The pod-gone grace is what waits for the Job's status to explain the loss: the production
    // default's order of magnitude here (the shared runtime's 150 ms races event delivery on a busy machine).
    const patient = await startRuntime(fake, { options: { tuning: { ...FAST_TUNING, podGoneGraceMs: 3000 } } });
    try {
      const s = spec();
      let phase = 'startup';
      const running = patient.run(s, { onPhase: (p) => (phase = p) });
      const pod = await podOf(fake, s);
      fake.mainRunning(pod);
      await fake.waitFor(() => phase === 'execution', 2000, 'execution phase');
      await fake.expireJobDeadline(jobNameFor(s.executionId));
      const raw = await running;
      expect(raw.observation).toMatchObject({ timedOut: 'execution', infraError: null });
    } finally {
      await patient.stop();
    }
  });

  it('OOMKilled main → oomKilled, outputs still collected', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stderr: 'allocating...' }));
    fake.mainTerminated(pod, 137, 'OOMKilled');
    const raw = await running;
    expect(raw.observation).toMatchObject({ oomKilled: true, exitCode: 137 });
    expect(raw.stderr).toBe('allocating...');
  });

  it('image pull errors fail at once with docker_error, long before the startup timeout', async () => {
    const s = spec({ startupTimeoutSec: 600 });
    const t0 = Date.now();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.waiting(pod, 'main', 'ErrImagePull', 'manifest unknown');
    const raw = await running;
    expect(Date.now() - t0).toBeLessThan(3000);
    expect(raw.observation.infraError).toMatchObject({ type: 'docker_error' });
    expect(raw.observation.infraError?.message).toContain('ErrImagePull');
  });

  it('deps failure → dependencyError with the log tail', async () => {
    const s = spec({ requirements: ['nonexistent-pkg==9'] });
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.depsRunning(pod);
    fake.setLog(pod, 'deps', 'ERROR: No matching distribution found for nonexistent-pkg==9\n');
    fake.depsTerminated(pod, 1);
    const raw = await running;
    expect(raw.observation.dependencyError).toContain('No matching distribution');
    expect(raw.observation.phase).toBe('startup');
  });

  it('pod deleted under a running run → internal_error', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.deletePod(pod);
    const raw = await running;
    expect(raw.observation.infraError).toMatchObject({ type: 'internal_error' });
  });

  it('a pod created and deleted within one read of the watch is still reported lost (not a startup timeout)', async () => {
    const s = spec({ startupTimeoutSec: 10 });
    fake.holdEvents();
    let pod: string;
    const running = rt.run(s);
    try {
      pod = await podOf(fake, s);
      fake.mainRunning(pod);
      fake.deletePod(pod, 0);
    } finally {
      fake.releaseEvents();
    }
    const t0 = Date.now();
    const raw = await running;
    expect(raw.observation.infraError).toMatchObject({ type: 'internal_error' });
    expect(raw.observation.infraError?.message).toContain('pod was deleted');
    expect(Date.now() - t0).toBeLessThan(5000);
  });

  it('pod evicted → internal_error naming the eviction', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.evict(pod);
    const raw = await running;
    expect(raw.observation.infraError?.message).toContain('evicted');
  });

  it('cancellation deletes the Job with background propagation and reports cancelled', async () => {
    const s = spec();
    const ac = new AbortController();
    const running = rt.run(s, { signal: ac.signal });
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    const before = fake.requests.length;
    ac.abort();
    const raw = await running;
    expect(raw.observation.cancelled).toBe(true);
    const del = fake.requests.slice(before).find((r) => r.method === 'DELETE');
    expect(del?.path).toContain(`/jobs/${jobNameFor(s.executionId)}`);
    await fake.waitFor(() => !fake.get('pods', 'sandpod-jobs', pod), 2000, 'pod removed by background propagation');
  });

  it('a cancel that comes after another attempt replaced the Job (same name, new uid) deletes only its own Job', async () => {
    // After a takeover the new holder may delete the Job and make its own of the same name (the
    // execution's); the stale attempt, not yet aware, must not hit it with its own delete.
    const s = spec();
    const ac = new AbortController();
    const running = rt.run(s, { signal: ac.signal });
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    const name = jobNameFor(s.executionId);
    const api = new KubeApi(fake.kubeConfig());
    const old = structuredClone(fake.get('jobs', 'sandpod-jobs', name)!);
    let replacement = '';
    fake.holdEvents();
    try {
      await api.deleteJob('sandpod-jobs', name);
      await fake.waitFor(() => !fake.get('jobs', 'sandpod-jobs', name), 5000, 'the old Job gone');
      const made = await api.createJob({ metadata: { name, namespace: 'sandpod-jobs', labels: old.metadata.labels, annotations: old.metadata.annotations }, spec: old.spec });
      replacement = made?.metadata?.uid ?? '';
      expect(replacement).not.toBe(old.metadata.uid);
      const before = fake.requests.length;
      ac.abort();
      await fake.waitFor(() => fake.requests.slice(before).some((r) => r.method === 'DELETE' && r.path.includes(`/jobs/${name}`)), 5000, 'the stale attempt\'s delete');
    } finally {
      fake.releaseEvents();
    }
    await running.catch(() => undefined);
    expect(fake.get('jobs', 'sandpod-jobs', name)?.metadata.uid).toBe(replacement);
    await api.deleteJob('sandpod-jobs', name);
  });

  it('409 on create is success: a second attempt for the same execution attaches to the same Job', async () => {
    const s = spec();
    const first = startRuntime(fake);
    const other = await first;
    try {
      const a = rt.run(s);
      const pod = await podOf(fake, s);
      // The same execution started by another replica: its create gets 409 and it follows the same Job.
      const b = other.run(s);
      fake.mainRunning(pod);
      fake.setOutput(pod, ({ stdout: 'once' }));
      fake.mainTerminated(pod, 0);
      const [ra, rb] = await Promise.all([a, b]);
      expect(fake.list('jobs').filter((j) => j.metadata.name === jobNameFor(s.executionId))).toHaveLength(1);
      expect(ra.observation.exitCode).toBe(0);
      expect(rb.observation.exitCode).toBe(0);
    } finally {
      await other.stop();
    }
  });
});

describe('kubernetes runtime: restarts and watch trouble', () => {
  it('a new runtime instance adopts a running Job after a restart', async () => {
    const s = spec();
    const first = await startRuntime(fake);
    const lost = first.run(s).catch((e: unknown) => e);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    await first.stop();
    expect(await lost).toBeInstanceOf(Error);

    const second = await startRuntime(fake, {
      options: { hooks: { liveExecutionIds: async (ids) => new Set(ids) } },
    });
    try {
      const adopted = second.run(s, { adopt: true });
      fake.setOutput(pod, ({ stdout: 'survived' }));
      fake.mainTerminated(pod, 0);
      const raw = await adopted;
      expect(raw.stdout).toBe('survived');
      expect(raw.observation.exitCode).toBe(0);
    } finally {
      await second.stop();
    }
  });

  it('adopt rejects with RunGoneError when there is no Job', async () => {
    await expect(rt.run(spec(), { adopt: true })).rejects.toBeInstanceOf(RunGoneError);
  });

  it('survives the server closing its watches', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.closeWatches();
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stdout: 'after reconnect' }));
    fake.mainTerminated(pod, 0);
    expect((await running).stdout).toBe('after reconnect');
  });

  it('re-lists after 410 Gone and still sees changes made while disconnected', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stdout: 'after 410' }));
    // Changes while the watch is down, then the history is compacted away: the resume gets 410.
    fake.closeWatches();
    fake.mainTerminated(pod, 0);
    fake.compact();
    expect((await running).stdout).toBe('after 410');
  });
});

describe('kubernetes runtime: start, health, config', () => {
  it('start() deletes Jobs whose execution is no longer live', async () => {
    const s = spec();
    const ac = new AbortController();
    const first = await startRuntime(fake);
    const r = first.run(s, { signal: ac.signal }).catch(() => undefined);
    await podOf(fake, s);
    await first.stop();
    await r;
    const second = await startRuntime(fake, { options: { hooks: { liveExecutionIds: async () => new Set() } } });
    try {
      await fake.waitFor(() => !fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId)), 10_000, 'orphan job deleted');
    } finally {
      await second.stop();
    }
  });

  it('health: available and gvisor from the API; degraded when the API is down', async () => {
    expect(await rt.health()).toMatchObject({ available: true, gvisorAvailable: true, engine: 'kubernetes', limits: 'kubernetes' });
    fake.setDown(true);
    try {
      expect((await rt.health()).available).toBe(false);
    } finally {
      fake.setDown(false);
    }
  });

  it('an API outage mid-run degrades health and loses nothing: the run finishes once the API is back', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    // Mid-run: the run's objects exist (the Secret is created right after the Job and its pod).
    await fake.waitFor(() => fake.get('secrets', 'sandpod-jobs', jobNameFor(s.executionId)) !== undefined, 5000, 'the run Secret');
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stdout: 'outlived the outage' }));
    fake.setDown(true);
    fake.closeWatches();
    expect((await rt.health()).available).toBe(false);
    fake.mainTerminated(pod, 0);
    await new Promise((r) => setTimeout(r, 300));
    fake.setDown(false);
    const raw = await running;
    expect(raw.stdout).toBe('outlived the outage');
    expect((await rt.health()).available).toBe(true);
  });

  it('strict mode without the RuntimeClass refuses to run (config_error), permissive runs without it', async () => {
    const f2 = await FakeKube.start();
    try {
      const strict = await startRuntime(f2, { config: testConfig({ security_mode: 'strict' }) });
      const raw = await strict.run(spec());
      expect(raw.observation.infraError).toMatchObject({ type: 'config_error' });
      expect(f2.list('jobs')).toHaveLength(0);
      await strict.stop();
      const permissive = await startRuntime(f2);
      const s = spec();
      const running = permissive.run(s);
      const pod = await f2.waitForPod(jobNameFor(s.executionId));
      expect(f2.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))!.spec.template.spec.runtimeClassName).toBeUndefined();
      f2.mainRunning(pod);
      f2.mainTerminated(pod, 0);
      expect((await running).observation.exitCode).toBe(0);
      expect((await permissive.health()).gvisorAvailable).toBe(false);
      await permissive.stop();
    } finally {
      await f2.close();
    }
  });

  it('strict mode with the RuntimeClass unreadable (API error) rejects the attempt instead of failing the run as config_error', async () => {
    const f2 = await FakeKube.start();
    f2.addRuntimeClass('gvisor');
    try {
      // Both the lookup at start() and the one in run() fail: nothing is known about the RuntimeClass.
      f2.failNext(/runtimeclasses/, 500, 2, 'GET');
      const strict = await startRuntime(f2, { config: testConfig({ security_mode: 'strict' }) });
      try {
        const err = await strict.run(spec()).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(Error);
        expect((err as Error).message).toContain('RuntimeClass');
        expect(f2.list('jobs')).toHaveLength(0);
        // The next attempt reads it and runs.
        const s = spec();
        const running = strict.run(s);
        const pod = await f2.waitForPod(jobNameFor(s.executionId));
        expect(f2.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))!.spec.template.spec.runtimeClassName).toBe('gvisor');
        f2.mainRunning(pod);
        f2.mainTerminated(pod, 0);
        expect((await running).observation).toMatchObject({ exitCode: 0, infraError: null });
      } finally {
        await strict.stop();
      }
    } finally {
      await f2.close();
    }
  });

  it('speaks v4.channel.k8s.io when the server has no v5', async () => {
    const f4 = await FakeKube.start({ execProtocols: ['v4.channel.k8s.io'], goneAsHttp: true });
    try {
      const r4 = await startRuntime(f4);
      const s = spec();
      const running = r4.run(s);
      const pod = await f4.waitForPod(jobNameFor(s.executionId));
      f4.mainRunning(pod);
      f4.setOutput(pod, ({ stdout: 'v4', files: { 'big.bin': Buffer.alloc(200_000, 7) } }));
      f4.mainTerminated(pod, 0);
      const raw = await running;
      expect(raw.stdout).toBe('v4');
      expect(raw.artifacts[0]).toMatchObject({ name: 'big.bin', size: 200_000 });
      expect(f4.execs.every((e) => e.protocol === 'v4.channel.k8s.io')).toBe(true);
      await r4.stop();
    } finally {
      await f4.close();
    }
  });
});

describe('kubernetes runtime: one guard policy, applied outside', () => {
  /** The service's policy in miniature: retry around breaker around one run attempt. */
  function guarded<T>(breaker: CircuitBreaker, attempt: () => Promise<T>, seen: { attempts: number; failuresAtRetry: number[] }): Promise<T> {
    return withRetry(
      async () => {
        seen.attempts++;
        return breaker.exec(attempt);
      },
      { attempts: 2, baseDelayMs: 1, onRetry: () => seen.failuresAtRetry.push(breaker.snapshot().failure_count) },
    );
  }

  it('a Job create that gets a 500 rejects run(); the outer policy counts it once and its next attempt runs', async () => {
    const breaker = new CircuitBreaker();
    const seen = { attempts: 0, failuresAtRetry: [] as number[] };
    const s = spec();
    const before = fake.requests.length;
    fake.failNext(/\/jobs$/, 500, 1, 'POST');
    const running = guarded(breaker, () => rt.run(s), seen);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.mainTerminated(pod, 3);
    expect((await running).observation.exitCode).toBe(3);
    expect(seen).toEqual({ attempts: 2, failuresAtRetry: [1] });
    // The runtime made the create twice (once per attempt), never retrying it by itself.
    expect(fake.apiCalls(before).filter((r) => r.method === 'POST' && r.path.endsWith('/jobs'))).toHaveLength(2);
    expect(breaker.snapshot()).toMatchObject({ state: 'closed', failure_count: 0 });
  });

  it('a Job create whose answer was lost after the server stored it: the next attempt takes that Job (409) and runs once', async () => {
    const breaker = new CircuitBreaker();
    const seen = { attempts: 0, failuresAtRetry: [] as number[] };
    const s = spec();
    fake.failNext(/\/jobs$/, 500, 1, 'POST', { afterCommit: true });
    const running = guarded(breaker, () => rt.run(s), seen);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stdout: 'once' }));
    fake.mainTerminated(pod, 0);
    const raw = await running;
    expect(raw.stdout).toBe('once');
    expect(seen.attempts).toBe(2);
    expect(fake.list('jobs').filter((j) => j.metadata.name === jobNameFor(s.executionId))).toHaveLength(1);
    const job = fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))!;
    expect(fake.get('secrets', 'sandpod-jobs', jobNameFor(s.executionId))!.metadata.ownerReferences?.[0]?.uid).toBe(job.metadata.uid);
  });

  it('a Secret left by an earlier attempt whose Job is gone is replaced, so the garbage collector cannot take it from the new pod', async () => {
    const s = spec();
    const name = jobNameFor(s.executionId);
    const stale = randomUUID();
    await new KubeApi(fake.kubeConfig()).createSecret({
      metadata: { name, namespace: 'sandpod-jobs', ownerReferences: [{ apiVersion: 'batch/v1', kind: 'Job', name, uid: stale }] },
      stringData: { 'main.py': 'old' },
    });
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.mainTerminated(pod, 0);
    expect((await running).observation.exitCode).toBe(0);
    const job = fake.get('jobs', 'sandpod-jobs', name)!;
    const owners = fake.get('secrets', 'sandpod-jobs', name)!.metadata.ownerReferences ?? [];
    expect(owners.map((o) => o.uid)).toEqual([job.metadata.uid]);
  });

  it('the runtime makes plain calls: a failed create reaches the caller as one retryable rejection', async () => {
    fake.failNext(/\/jobs$/, 503, 1, 'POST');
    const s = spec();
    const before = fake.requests.length;
    const err = await rt.run(s).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect(err).not.toBeInstanceOf(UnretryableError);
    expect((err as Error).message).toContain('create job');
    expect(fake.apiCalls(before).filter((r) => r.method === 'POST' && r.path.endsWith('/jobs'))).toHaveLength(1);
    expect(fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))).toBeUndefined();
  });
});

describe('kubernetes runtime: API errors as the outer policy sees them', () => {
  it('a 403 on the Job create (RBAC) rejects with UnretryableError: no retry can fix it', async () => {
    fake.failNext(/\/jobs$/, 403, 1, 'POST');
    const err = await rt.run(spec()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnretryableError);
    expect((err as Error).message).toMatch(/create job: HTTP 403/);
  });

  it('a Secret create that fails removes the Job again: a failed attempt leaves no Job behind', async () => {
    fake.failNext(/\/secrets$/, 500, 1, 'POST');
    const s = spec();
    await expect(rt.run(s)).rejects.toThrow(/create secret/);
    await fake.waitFor(() => !fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId)), 2000, 'job removed');
  });
});

describe('kubernetes runtime: truncated streams (issue #9)', () => {
  it('the runner cut stdout at max_stdout_bytes and said so: stdout_truncated is set', async () => {
    const s = spec({ maxStdoutBytes: 16 });
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stdout: 'x'.repeat(16), stderr: 'short', report: { exit_code: 0, stdout_truncated: true, stderr_truncated: false } }));
    fake.mainTerminated(pod, 0);
    const raw = await running;
    expect(raw.stdout).toBe('x'.repeat(16));
    expect(raw.stdoutTruncated).toBe(true);
    expect(raw.stderrTruncated).toBe(false);
  });

  it('a stream file longer than max_stdout_bytes (report silent or missing) is cut here and flagged', async () => {
    const s = spec({ maxStdoutBytes: 16 });
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.setOutput(pod, ({ stdout: 'ok', stderr: 'e'.repeat(40) }));
    fake.mainTerminated(pod, 1);
    const raw = await running;
    expect(raw.stderr).toBe('e'.repeat(16));
    expect(raw.stderrTruncated).toBe(true);
    expect(raw.stdoutTruncated).toBe(false);
  });
});

describe('kubernetes runtime: OOM under a gVisor sandbox (issue #9)', () => {
  it('main OOM-killed before the collector started, the collector failing with StartError → oom, not docker_error', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.schedule(pod);
    // main starts; the program eats the sandbox's memory before the kubelet gets to the collector.
    fake.updatePod(pod, (p) => {
      p.status.containerStatuses.find((c: { name: string }) => c.name === 'main').state = { running: { startedAt: new Date().toISOString() } };
    });
    fake.mainTerminated(pod, 137, 'OOMKilled');
    fake.terminated(pod, 'collector', 128, 'StartError');
    const raw = await running;
    expect(raw.observation).toMatchObject({ oomKilled: true, exitCode: 137, infraError: null });
    expect(classify(raw).status).toBe('oom');
  });

  it('the collector StartError shows before main is seen dead (main exits 137, reason Error) → still oom', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.terminated(pod, 'collector', 128, 'StartError');
    await new Promise((r) => setTimeout(r, 50));
    fake.mainTerminated(pod, 137, 'Error');
    const raw = await running;
    expect(raw.observation).toMatchObject({ oomKilled: true, exitCode: 137, infraError: null });
    expect(classify(raw)).toMatchObject({ status: 'oom', exitCode: 137 });
    // The Job is left to its TTL, not deleted as for an image error.
    expect(fake.get('jobs', 'sandpod-jobs', jobNameFor(s.executionId))).toBeDefined();
  });

  it('a collector that cannot start while main keeps running is still docker_error', async () => {
    const s = spec();
    const running = rt.run(s);
    const pod = await podOf(fake, s);
    fake.mainRunning(pod);
    fake.terminated(pod, 'collector', 128, 'StartError');
    const raw = await running;
    expect(raw.observation.infraError).toMatchObject({ type: 'docker_error' });
  });
});

describe('kubernetes runtime: a pod of an earlier attempt still terminating (issue #9)', () => {
  it('a retry after a failed Secret create runs on its own pod, not on the old Job pod that lingers', async () => {
    const f2 = await FakeKube.start({ schedulePods: true, podDeletionDelayMs: 3000 });
    const r2 = await startRuntime(f2);
    try {
      const s = spec();
      const name = jobNameFor(s.executionId);
      f2.failNext(/\/secrets$/, 500, 1, 'POST');
      const running = withRetry(() => r2.run(s), { attempts: 2, baseDelayMs: 1 });
      // The first attempt's Job is deleted; its pod, bound to the node, lingers while terminating.
      await f2.waitFor(() => f2.list('pods').some((p) => p.metadata.labels?.['job-name'] === name && p.metadata.deletionTimestamp), 5000, 'old pod terminating');
      const old = f2.list('pods').find((p) => p.metadata.deletionTimestamp)!.metadata.name;
      const pod = await f2.waitForCurrentPod(name);
      expect(pod).not.toBe(old);
      f2.mainRunning(pod);
      f2.setOutput(pod, { stdout: 'second attempt' });
      f2.mainTerminated(pod, 0);
      const raw = await running;
      expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
      expect(raw.stdout).toBe('second attempt');
      expect(f2.get('pods', 'sandpod-jobs', old)).toBeDefined();
    } finally {
      await r2.stop();
      await f2.close();
    }
  });
});
