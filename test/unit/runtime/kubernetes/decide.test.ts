import { describe, expect, it } from 'vitest';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import { decide, EARLY_COLLECT_WINDOW_MS, IMAGE_ERRORS, newRunState, START_ERRORS, toMs, type Action, type RunState } from '../../../../src/runtime/kubernetes/runs/decide.ts';
import { emptyOutput, type CollectedOutput } from '../../../../src/runtime/kubernetes/runs/output-tar.ts';
import { makeJob, makePod } from '../../../support/kube-builders.ts';

const T0 = Date.parse('2026-01-01T00:00:00Z');
const S = 1000;

function run(over: Partial<RunState> = {}): RunState {
  return newRunState({ executionId: 'e1', jobName: 'sp-run', startedAt: T0, startupTimeoutMs: 60 * S, podGoneGraceMs: 3 * S, jobSeen: true, podSeen: true, ...over });
}

const output: CollectedOutput = { ...emptyOutput(), stdout: 'x', entries: 2 };

const job = makeJob().obj();
type Row = { name: string; run: RunState; job: V1Job | undefined; pod: V1Pod | undefined; now: number; expect: (a: Action[]) => void };

const types = (a: Action[]) => a.map((x) => x.type);
const finishOf = (a: Action[]) => {
  const f = a.find((x) => x.type === 'finish');
  if (!f || f.type !== 'finish') throw new Error(`no finish in ${JSON.stringify(types(a))}`);
  return f.observation;
};

const rows: Row[] = [
  {
    name: 'finished run: nothing to do',
    run: run({ finished: true }),
    job,
    pod: makePod().obj(),
    now: T0,
    expect: (a) => expect(a).toEqual([]),
  },
  {
    name: 'no pod yet, before the startup deadline: wake at the deadline',
    run: run({ podSeen: false }),
    job,
    pod: undefined,
    now: T0 + S,
    expect: (a) => expect(a).toEqual([{ type: 'wakeAt', at: T0 + 60 * S }]),
  },
  {
    name: 'init container running → startup phase, wait',
    run: run(),
    job,
    pod: makePod().withDeps().running('deps', T0 + S).obj(),
    now: T0 + 2 * S,
    expect: (a) => expect(types(a)).toEqual(['wakeAt']),
  },
  {
    name: 'main running → execution phase reported once',
    run: run(),
    job,
    pod: makePod().mainRunning(T0 + 5 * S).obj(),
    now: T0 + 6 * S,
    expect: (a) => expect(a).toEqual([{ type: 'enterExecution', mainStartedAt: T0 + 5 * S }]),
  },
  {
    name: 'main running, phase already reported → nothing',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().mainRunning(T0 + 5 * S).obj(),
    now: T0 + 6 * S,
    expect: (a) => expect(a).toEqual([]),
  },
  {
    name: 'main terminated, collector running → collect',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().mainTerminated(0, 'Completed', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(a).toEqual([{ type: 'collect', pod: 'sp-run-abcde' }]),
  },
  {
    name: 'main terminated before we saw it running → execution phase, then collect',
    run: run(),
    job,
    pod: makePod().mainTerminated(1, 'Error', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(types(a)).toEqual(['enterExecution', 'collect']),
  },
  {
    name: 'collected, collector still running → release',
    run: run({ phaseReported: 'execution', collection: { ok: true, output } }),
    job,
    pod: makePod().mainTerminated(0, 'Completed', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(a).toEqual([{ type: 'release', pod: 'sp-run-abcde' }]),
  },
  {
    name: 'collected and released → finish with container timing',
    run: run({ phaseReported: 'execution', collection: { ok: true, output }, released: true }),
    job,
    pod: makePod().mainTerminated(0, 'Completed', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(finishOf(a)).toMatchObject({ exitCode: 0, phase: 'completed', startupMs: 5 * S, executionMs: 2 * S, totalMs: 7 * S, infraError: null });
    },
  },
  {
    name: 'non-zero exit → phase failed, exit code kept',
    run: run({ phaseReported: 'execution', collection: { ok: true, output }, released: true }),
    job,
    pod: makePod().mainTerminated(1, 'Error', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ exitCode: 1, phase: 'failed' }),
  },
  {
    name: 'collection failed for good → internal_error (outputs lost)',
    run: run({ phaseReported: 'execution', collection: { ok: false, error: 'exec refused' }, released: true }),
    job,
    pod: makePod().mainTerminated(0, 'Completed', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a).infraError).toEqual({ type: 'internal_error', message: 'outputs could not be collected: exec refused' }),
  },
  {
    name: 'OOMKilled → oomKilled (collected as usual)',
    run: run({ phaseReported: 'execution', collection: { ok: true, output }, released: true }),
    job,
    pod: makePod().mainTerminated(137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: true, exitCode: 137, infraError: null }),
  },
  {
    name: 'OOMKilled and the collector gone too (whole sandbox killed) → oom, not internal_error',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Failed').terminated('main', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).terminated('collector', 137, 'Error', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null }),
  },
  // Issue #9: under gVisor the pod is one sandbox; an OOM before the collector started can take the
  // sandbox down, and the collector then reports StartError (exit 128). That is oom, not docker_error.
  {
    name: 'gVisor: main OOMKilled, collector never started (StartError) → oom, not docker_error',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Failed').terminated('main', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).terminated('collector', 128, 'StartError', T0 + 7 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['finish']);
      expect(finishOf(a)).toMatchObject({ oomKilled: true, exitCode: 137, infraError: null, phase: 'failed' });
    },
  },
  {
    name: 'gVisor: main 137 with reason Error, collector StartError → oom (the sandbox died of memory)',
    run: run(),
    job,
    pod: makePod().phase('Failed').terminated('main', 137, 'Error', T0 + 5 * S, T0 + 7 * S).terminated('collector', 128, 'StartError', T0 + 7 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['enterExecution', 'finish']);
      expect(finishOf(a)).toMatchObject({ oomKilled: true, exitCode: 137, infraError: null });
    },
  },
  {
    name: 'gVisor: main 137 with reason Error, another container says OOMKilled → oom',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Failed').terminated('main', 137, 'Error', T0 + 5 * S, T0 + 7 * S).terminated('collector', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null }),
  },
  {
    name: 'main OOMKilled, collector ContainerCannotRun → oom',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Failed').terminated('main', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).terminated('collector', 128, 'ContainerCannotRun', T0 + 7 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null }),
  },
  {
    name: 'main OOMKilled, collector still being created → wait for it (outputs may still come)',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Running').terminated('main', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).waiting('collector', 'ContainerCreating').obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(a).toEqual([]),
  },
  {
    name: 'main OOMKilled, the collector never came and the Job deadline fired → oom, not a timeout',
    run: run({ phaseReported: 'execution' }),
    job: makeJob().deadlineExceeded().obj(),
    pod: makePod().phase('Running').terminated('main', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).waiting('collector', 'ContainerCreating').obj(),
    now: T0 + 100 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: true, timedOut: null, infraError: null }),
  },
  {
    name: 'main OOMKilled with the collector running → collect its outputs as usual',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().mainTerminated(137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(a).toEqual([{ type: 'collect', pod: 'sp-run-abcde' }]),
  },
  {
    name: 'collected, collection failed, main 137 and collector StartError → oom, not internal_error',
    run: run({ phaseReported: 'execution', collection: { ok: false, error: 'exec refused' }, released: true }),
    job,
    pod: makePod().phase('Failed').terminated('main', 137, 'Error', T0 + 5 * S, T0 + 7 * S).terminated('collector', 128, 'StartError', T0 + 7 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null }),
  },
  {
    name: 'collector StartError while main still shows running → wait a moment for main\'s status',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Running').running('main', T0 + 5 * S).terminated('collector', 128, 'StartError', T0 + 6 * S, T0 + 6 * S).obj(),
    now: T0 + 7 * S,
    // finishedAt has whole seconds: one more second, then the grace.
    expect: (a) => expect(a).toEqual([{ type: 'wakeAt', at: T0 + 10 * S }]),
  },
  {
    name: 'collector StartError, main still running after the grace → docker_error (a real start failure)',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Running').running('main', T0 + 5 * S).terminated('collector', 128, 'StartError', T0 + 6 * S, T0 + 6 * S).obj(),
    now: T0 + 10 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['deleteJob', 'finish']);
      expect(finishOf(a).infraError).toMatchObject({ type: 'docker_error' });
    },
  },
  {
    name: 'main 137 after a pod deletion (runner killed the program, collector exited 0) → not oom',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Failed').terminated('main', 137, 'Error', T0 + 5 * S, T0 + 7 * S).terminated('collector', 0, 'Completed', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: false, infraError: { type: 'internal_error' } }),
  },
  {
    name: 'main exited 137 while the collector runs (no sign of memory) → collected, oomKilled not claimed',
    run: run({ phaseReported: 'execution', collection: { ok: true, output }, released: true }),
    job,
    pod: makePod().mainTerminated(137, 'Error', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: false, exitCode: 137, infraError: null }),
  },
  {
    name: 'main ended but the collector is gone → internal_error',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Failed').terminated('main', 0, 'Completed', T0 + 5 * S, T0 + 7 * S).terminated('collector', 2, 'Error', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(finishOf(a).infraError?.message).toContain('collector');
      expect(finishOf(a)).toMatchObject({ cancelled: false, timedOut: null, dependencyError: null, exitCode: 0, phase: 'completed' });
    },
  },
  {
    name: 'main ended, collector not started yet → wait',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Running').terminated('main', 0, 'Completed', T0 + 5 * S, T0 + 7 * S).waiting('collector', 'ContainerCreating').obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(a).toEqual([]),
  },
  // Rows that pin each rule of the OOM and collector branches on its own (the mutation run showed
  // each could be changed, or dropped, without any row above noticing).
  {
    name: 'main exited 1 and the collector could not start → docker_error, not oom',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Failed').terminated('main', 1, 'Error', T0 + 5 * S, T0 + 7 * S).terminated('collector', 128, 'StartError', T0 + 7 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['deleteJob', 'finish']);
      expect(finishOf(a)).toMatchObject({ oomKilled: false, exitCode: 1, infraError: { type: 'docker_error', message: 'collector: StartError:' } });
    },
  },
  {
    name: 'gVisor: main 137 with reason Error, deps completed, collector OOMKilled → oom (one OOM-killed container is enough)',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod()
      .withDeps()
      .phase('Failed')
      .terminated('deps', 0, 'Completed', T0 + S, T0 + 3 * S)
      .terminated('main', 137, 'Error', T0 + 5 * S, T0 + 7 * S)
      .terminated('collector', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S)
      .obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['finish']);
      expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null, depInstallMs: 2 * S });
    },
  },
  {
    name: 'main OOMKilled, collector still running but the pod is being deleted → oom now (its outputs are going away)',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().mainTerminated(137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).deleting().obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['finish']);
      expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null, timedOut: null });
    },
  },
  {
    name: 'main OOMKilled with the collector running, and the Job deadline fired → oom, not a timeout',
    run: run({ phaseReported: 'execution' }),
    job: makeJob().deadlineExceeded().obj(),
    pod: makePod().mainTerminated(137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 100 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['finish']);
      expect(finishOf(a)).toMatchObject({ oomKilled: true, timedOut: null, infraError: null });
    },
  },
  {
    name: 'main OOMKilled, collector StartError, the pod phase not updated yet → oom, not docker_error',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Running').terminated('main', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).terminated('collector', 128, 'StartError', T0 + 7 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['finish']);
      expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null });
    },
  },
  ...['Failed', 'Succeeded'].map(
    (phase): Row => ({
      name: `main OOMKilled, pod ${phase} with the collector still waiting on its image → oom, not docker_error`,
      run: run({ phaseReported: 'execution' }),
      job,
      pod: makePod().phase(phase).terminated('main', 137, 'OOMKilled', T0 + 5 * S, T0 + 7 * S).waiting('collector', 'ImagePullBackOff', 'Back-off pulling image "c"').obj(),
      now: T0 + 8 * S,
      expect: (a) => {
        expect(types(a)).toEqual(['finish']);
        expect(finishOf(a)).toMatchObject({ oomKilled: true, infraError: null });
      },
    }),
  ),
  {
    name: 'main ended, collector terminated, the pod phase not updated yet → internal_error (outputs lost)',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().phase('Running').terminated('main', 0, 'Completed', T0 + 5 * S, T0 + 7 * S).terminated('collector', 2, 'Error', T0 + 5 * S, T0 + 7 * S).obj(),
    now: T0 + 8 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ exitCode: 0, infraError: { type: 'internal_error', message: 'outputs lost: the collector container is gone' } }),
  },
  ...['Failed', 'Succeeded'].map(
    (phase): Row => ({
      name: `main ended, pod ${phase} before the collector ever started → internal_error, not a wait`,
      run: run({ phaseReported: 'execution' }),
      job,
      pod: makePod().phase(phase).terminated('main', 0, 'Completed', T0 + 5 * S, T0 + 7 * S).waiting('collector', 'ContainerCreating').obj(),
      now: T0 + 8 * S,
      expect: (a) => {
        expect(types(a)).toEqual(['finish']);
        expect(finishOf(a)).toMatchObject({ exitCode: 0, infraError: { type: 'internal_error', message: 'outputs lost: the collector container is gone' } });
      },
    }),
  ),
  {
    name: 'deps init container cannot start (StartError) while main waits → docker_error at once',
    run: run(),
    job,
    pod: makePod().withDeps().terminated('deps', 128, 'StartError', T0 + S, T0 + S).waiting('main', 'PodInitializing').obj(),
    now: T0 + 2 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['deleteJob', 'finish']);
      expect(finishOf(a)).toMatchObject({ phase: 'startup', infraError: { type: 'docker_error', message: 'deps: StartError:' } });
    },
  },
  {
    name: 'deps installed (exit 0), main running → execution phase, no dependency error',
    run: run(),
    job,
    pod: makePod().withDeps().terminated('deps', 0, 'Completed', T0 + S, T0 + 4 * S).mainRunning(T0 + 5 * S).obj(),
    now: T0 + 6 * S,
    expect: (a) => expect(a).toEqual([{ type: 'enterExecution', mainStartedAt: T0 + 5 * S }]),
  },
  {
    name: 'ErrImageNeverPull without a message → docker_error naming the container and the reason',
    run: run(),
    job,
    pod: makePod().waiting('main', 'ErrImageNeverPull').obj(),
    now: T0 + S,
    expect: (a) => {
      expect(types(a)).toEqual(['deleteJob', 'finish']);
      expect(finishOf(a).infraError).toEqual({ type: 'docker_error', message: expect.stringMatching(/^main: ErrImageNeverPull:?$/) });
    },
  },
  {
    name: 'pod evicted without a message from the kubelet → internal_error saying so',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: (() => {
      const p = makePod().mainRunning(T0 + 5 * S).evicted().obj();
      delete p.status!.message;
      return p;
    })(),
    now: T0 + 9 * S,
    expect: (a) => expect(finishOf(a).infraError).toEqual({ type: 'internal_error', message: 'pod evicted: no message' }),
  },
  ...['ErrImagePull', 'ImagePullBackOff', 'InvalidImageName'].map(
    (reason): Row => ({
      name: `${reason} → docker_error at once and the Job deleted`,
      run: run(),
      job,
      pod: makePod().waiting('main', reason, 'pull access denied').obj(),
      now: T0 + S,
      expect: (a) => {
        expect(types(a)).toEqual(['deleteJob', 'finish']);
        expect(finishOf(a).infraError).toMatchObject({ type: 'docker_error' });
      },
    }),
  ),
  {
    name: 'image pull error on the deps init container → docker_error',
    run: run(),
    job,
    pod: makePod().withDeps().waiting('deps', 'ImagePullBackOff', 'Back-off pulling image "x"').obj(),
    now: T0 + S,
    expect: (a) => {
      expect(a[0]).toEqual({ type: 'deleteJob' });
      expect(finishOf(a).infraError).toEqual({ type: 'docker_error', message: 'deps: ImagePullBackOff: Back-off pulling image "x"' });
    },
  },
  {
    name: 'command cannot start (StartError) → docker_error',
    run: run(),
    job,
    pod: makePod().terminated('main', 128, 'StartError', T0 + S, T0 + S).running('collector', T0 + S).obj(),
    now: T0 + 2 * S,
    expect: (a) => {
      expect(a[0]).toEqual({ type: 'deleteJob' });
      // No message from the kubelet: the reason alone (a trailing ':' is left today; either is fine).
      expect(finishOf(a).infraError).toEqual({ type: 'docker_error', message: expect.stringMatching(/^main: StartError:?$/) });
    },
  },
  {
    name: 'unschedulable before the deadline → wait for it',
    run: run(),
    job,
    pod: makePod().unschedulable().obj(),
    now: T0 + 30 * S,
    expect: (a) => expect(a).toEqual([{ type: 'wakeAt', at: T0 + 60 * S }]),
  },
  {
    name: 'unschedulable past the startup timeout → startup timeout, Job deleted',
    run: run(),
    job,
    pod: makePod().unschedulable().obj(),
    now: T0 + 60 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['deleteJob', 'finish']);
      expect(finishOf(a)).toMatchObject({ timedOut: 'startup', phase: 'startup', exitCode: null });
    },
  },
  {
    name: 'slow dependency install past the startup timeout → startup timeout with dep time',
    run: run(),
    job,
    pod: makePod().withDeps().running('deps', T0 + 2 * S).obj(),
    now: T0 + 61 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ timedOut: 'startup', depInstallMs: 59 * S }),
  },
  {
    name: 'deps failed, log not fetched → fetch the log tail',
    run: run(),
    job,
    pod: makePod().withDeps().phase('Failed').terminated('deps', 1, 'Error', T0 + S, T0 + 3 * S).obj(),
    now: T0 + 4 * S,
    expect: (a) => expect(a).toEqual([{ type: 'fetchDepsLog', pod: 'sp-run-abcde' }]),
  },
  {
    name: 'deps failed, log fetched → dependencyError with pip output',
    run: run({ depsLog: 'ERROR: No matching distribution found for nope\n' }),
    job,
    pod: makePod().withDeps().phase('Failed').terminated('deps', 1, 'Error', T0 + S, T0 + 3 * S).obj(),
    now: T0 + 4 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ dependencyError: 'ERROR: No matching distribution found for nope', phase: 'startup', depInstallMs: 2 * S }),
  },
  {
    name: 'deps failed with an empty log → generic dependencyError',
    run: run({ depsLog: '' }),
    job,
    pod: makePod().withDeps().phase('Failed').terminated('deps', 2, 'Error', T0 + S, T0 + 3 * S).obj(),
    now: T0 + 4 * S,
    expect: (a) => expect(finishOf(a).dependencyError).toContain('exit code 2'),
  },
  {
    name: 'deps OOMKilled → oom in the startup phase',
    run: run(),
    job,
    pod: makePod().withDeps().phase('Failed').terminated('deps', 137, 'OOMKilled', T0 + S, T0 + 3 * S).obj(),
    now: T0 + 4 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ oomKilled: true, phase: 'startup' }),
  },
  {
    name: 'Job DeadlineExceeded after main started → execution timeout (backstop)',
    run: run({ phaseReported: 'execution', mainStartedAt: T0 + 5 * S }),
    job: makeJob().deadlineExceeded().obj(),
    pod: undefined,
    now: T0 + 100 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ timedOut: 'execution', phase: 'execution', executionMs: 95 * S }),
  },
  {
    name: 'Job DeadlineExceeded before main started → startup timeout',
    run: run(),
    job: makeJob().deadlineExceeded().obj(),
    pod: makePod().obj(),
    now: T0 + 100 * S,
    expect: (a) => expect(finishOf(a)).toMatchObject({ timedOut: 'startup' }),
  },
  {
    name: 'pod evicted → internal_error with the kubelet message',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().mainRunning(T0 + 5 * S).evicted().obj(),
    now: T0 + 9 * S,
    expect: (a) => expect(finishOf(a).infraError).toEqual({ type: 'internal_error', message: 'pod evicted: The node was low on resource: ephemeral-storage.' }),
  },
  {
    name: 'pod vanished under a running run → note it and wait for the Job status',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: undefined,
    now: T0 + 9 * S,
    expect: (a) => expect(a).toEqual([{ type: 'notePodGone', at: T0 + 9 * S }, { type: 'wakeAt', at: T0 + 12 * S }]),
  },
  {
    name: 'pod being deleted by someone else, grace not over → wait',
    run: run({ phaseReported: 'execution', podGoneAt: T0 + 9 * S }),
    job,
    pod: makePod().mainRunning(T0 + 5 * S).deleting().obj(),
    now: T0 + 10 * S,
    expect: (a) => expect(a).toEqual([{ type: 'wakeAt', at: T0 + 12 * S }]),
  },
  {
    name: 'pod gone and the grace is over → internal_error',
    run: run({ phaseReported: 'execution', podGoneAt: T0 + 9 * S }),
    job,
    pod: undefined,
    now: T0 + 12 * S,
    expect: (a) => expect(finishOf(a).infraError).toEqual({ type: 'internal_error', message: 'the run pod was deleted while the run was in progress' }),
  },
  {
    name: 'Job deleted by someone else → internal_error',
    run: run({ phaseReported: 'execution' }),
    job: undefined,
    pod: makePod().mainRunning(T0 + 5 * S).obj(),
    now: T0 + 9 * S,
    expect: (a) => expect(finishOf(a).infraError).toEqual({ type: 'internal_error', message: 'the run Job was deleted while the run was in progress' }),
  },
  {
    name: 'pod vanished because we deleted the Job → not an error by itself',
    run: run({ jobDeleted: true, phaseReported: 'execution' }),
    job: undefined,
    pod: undefined,
    now: T0 + 9 * S,
    expect: (a) => expect(a).toEqual([]),
  },
  {
    name: 'cancel → delete the Job and finish cancelled',
    run: run({ cancelRequested: true }),
    job,
    pod: makePod().mainRunning(T0 + 5 * S).obj(),
    now: T0 + 9 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['deleteJob', 'finish']);
      expect(finishOf(a)).toMatchObject({ cancelled: true, phase: 'execution' });
    },
  },
  {
    name: 'cancel after the Job was already deleted → just finish',
    run: run({ cancelRequested: true, jobDeleted: true }),
    job: undefined,
    pod: undefined,
    now: T0 + 9 * S,
    expect: (a) => expect(types(a)).toEqual(['finish']),
  },
  // Warm (pool or cold-attach) runs: the program arrives by attach and the runner says `done N`.
  {
    name: 'warm: done 0 with the collector up → collect, without waiting for main to end',
    run: run({ phaseReported: 'execution', warm: { deliveredAt: T0 + 2 * S, done: { exitCode: 0, at: T0 + 3 * S } } }),
    job,
    pod: makePod().mainRunning(T0 + S).obj(),
    now: T0 + 3 * S,
    expect: (a) => expect(a).toEqual([{ type: 'collect', pod: 'sp-run-abcde' }]),
  },
  {
    name: 'warm: runner ended 123 with no done (its go connection closed before the go line) → internal_error, Job deleted',
    run: run({ phaseReported: 'execution', warm: { deliveredAt: T0 + 2 * S, done: null } }),
    job,
    pod: makePod().mainTerminated(123, 'Error', T0 + S, T0 + 3 * S).obj(),
    now: T0 + 4 * S,
    expect: (a) => {
      expect(types(a)).toEqual(['deleteJob', 'finish']);
      expect(finishOf(a).infraError).toMatchObject({ type: 'internal_error', message: expect.stringContaining('never reached the run pod') });
    },
  },
  {
    name: 'warm: a program that exits 123 itself (its runner said done 123) → collected like any exit',
    run: run({ phaseReported: 'execution', warm: { deliveredAt: T0 + 2 * S, done: { exitCode: 123, at: T0 + 3 * S } } }),
    job,
    pod: makePod().mainTerminated(123, 'Error', T0 + S, T0 + 3 * S).obj(),
    now: T0 + 4 * S,
    expect: (a) => expect(a).toEqual([{ type: 'collect', pod: 'sp-run-abcde' }]),
  },
  // The kubelet reports started containers at its next status sync: after `done`, the collector's
  // exec is tried before its status shows it (a refused upgrade opens no stream).
  {
    name: 'warm: done, the collector not reported running yet on a bound pod → an early collect',
    run: run({ phaseReported: 'execution', warm: { deliveredAt: T0 + 2 * S, done: { exitCode: 0, at: T0 + 3 * S } } }),
    job,
    pod: makePod().bound().obj(),
    now: T0 + 3 * S,
    expect: (a) => expect(a).toEqual([{ type: 'collect', pod: 'sp-run-abcde', early: true }]),
  },
  {
    name: 'warm: an early collect was refused → the next try at its time',
    run: run({ phaseReported: 'execution', warm: { deliveredAt: T0 + 2 * S, done: { exitCode: 0, at: T0 + 3 * S }, earlyCollectAt: T0 + 3 * S + 40 } }),
    job,
    pod: makePod().bound().obj(),
    now: T0 + 3 * S + 10,
    expect: (a) => expect(a).toEqual([{ type: 'wakeAt', at: T0 + 3 * S + 40 }]),
  },
  {
    name: `warm: past the early window (${EARLY_COLLECT_WINDOW_MS} ms after done) → the collector's status is waited for`,
    run: run({ phaseReported: 'execution', warm: { deliveredAt: T0 + 2 * S, done: { exitCode: 0, at: T0 + 3 * S }, earlyCollectAt: T0 + 5 * S } }),
    job,
    pod: makePod().bound().obj(),
    now: T0 + 3 * S + EARLY_COLLECT_WINDOW_MS,
    expect: (a) => expect(a).toEqual([]),
  },
  {
    name: 'warm: done but the pod is not bound to a node → no early collect',
    run: run({ phaseReported: 'execution', warm: { deliveredAt: T0 + 2 * S, done: { exitCode: 0, at: T0 + 3 * S } } }),
    job,
    pod: makePod().obj(),
    now: T0 + 3 * S,
    expect: (a) => expect(a).toEqual([]),
  },
  {
    name: 'cold (not warm) run: no early collect, whatever the pod',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().bound().obj(),
    now: T0 + 3 * S,
    expect: (a) => expect(a).toEqual([]),
  },
  {
    name: 'warm: outputs pulled early, the collector still not reported → it is released, then the run finishes',
    run: run({ phaseReported: 'execution', collection: { ok: true, output }, warm: { deliveredAt: T0 + 2 * S, done: { exitCode: 0, at: T0 + 3 * S }, collectedEarly: true } }),
    job,
    pod: makePod().bound().obj(),
    now: T0 + 3 * S + 50,
    expect: (a) => expect(a).toEqual([{ type: 'release', pod: 'sp-run-abcde' }]),
  },
  {
    name: 'cold run (not warm) whose main exits 123 → collected: only a warm runner means "not delivered" by it',
    run: run({ phaseReported: 'execution' }),
    job,
    pod: makePod().mainTerminated(123, 'Error', T0 + S, T0 + 3 * S).obj(),
    now: T0 + 4 * S,
    expect: (a) => expect(a).toEqual([{ type: 'collect', pod: 'sp-run-abcde' }]),
  },
];

describe('decide(run, job, pod, now)', () => {
  it.each(rows)('$name', (row) => {
    const before = JSON.stringify(row.run);
    row.expect(decide(row.run, row.job, row.pod, row.now));
    // Pure: the inputs are never modified.
    expect(JSON.stringify(row.run)).toBe(before);
  });

  it('is deterministic: the same inputs give the same actions', () => {
    const r = run();
    const pod = makePod().mainTerminated(0, 'Completed', T0 + 5 * S, T0 + 7 * S).obj();
    expect(decide(r, job, pod, T0 + 8 * S)).toEqual(decide(r, job, pod, T0 + 8 * S));
  });

  it('reads timestamps both as Date (typed list) and RFC 3339 strings (raw watch events)', () => {
    const pod = makePod().mainTerminated(0, 'Completed', T0 + 5 * S, T0 + 7 * S).obj();
    const asDates = structuredClone(pod);
    const t = asDates.status!.containerStatuses!.find((c) => c.name === 'main')!.state!.terminated!;
    t.startedAt = new Date(T0 + 5 * S);
    t.finishedAt = new Date(T0 + 7 * S);
    const r = run({ collection: { ok: true, output }, released: true, phaseReported: 'execution' });
    expect(finishOf(decide(r, job, asDates, T0 + 8 * S))).toEqual(finishOf(decide(r, job, pod, T0 + 8 * S)));
  });
});

describe('decide: small helpers and tables', () => {
  it('toMs reads Dates and RFC 3339 strings; anything else is null', () => {
    expect(toMs(new Date(T0))).toBe(T0);
    expect(toMs('2026-01-01T00:00:00Z')).toBe(T0);
    expect(toMs(undefined)).toBeNull();
    expect(toMs(null)).toBeNull();
    expect(toMs('not a time')).toBeNull();
    expect(toMs(new Date(Number.NaN))).toBeNull();
  });

  it('the image and start error reasons, as Kubernetes names them', () => {
    expect([...IMAGE_ERRORS].sort()).toEqual(['ErrImageNeverPull', 'ErrImagePull', 'ImagePullBackOff', 'InvalidImageName']);
    expect([...START_ERRORS].sort()).toEqual(['ContainerCannotRun', 'StartError']);
  });

  it('a new run state has seen nothing yet', () => {
    const s = newRunState({ executionId: 'e', jobName: 'j', startedAt: T0, startupTimeoutMs: 1, podGoneGraceMs: 1 });
    expect(s).toMatchObject({ jobSeen: false, podSeen: false, finished: false });
  });
});

describe('decide: only a Job that failed for its deadline is a timeout', () => {
  const withCondition = (c: { type: string; status: string; reason?: string }): V1Job => ({ ...makeJob().obj(), status: { conditions: [{ type: 'Complete', status: 'False' }, c] } });
  it.each([
    ['Failed for another reason', { type: 'Failed', status: 'True', reason: 'BackoffLimitExceeded' }],
    ['a Failed condition that is not true', { type: 'Failed', status: 'False', reason: 'DeadlineExceeded' }],
    ['another condition with that reason', { type: 'Suspended', status: 'True', reason: 'DeadlineExceeded' }],
  ])('%s: no timeout, the run waits', (_label, c) => {
    const a = decide(run(), withCondition(c), makePod().obj(), T0 + S);
    expect(a.some((x) => x.type === 'finish')).toBe(false);
  });

  it('a deadline condition among others is found', () => {
    const a = decide(run(), withCondition({ type: 'Failed', status: 'True', reason: 'DeadlineExceeded' }), makePod().obj(), T0 + S);
    expect(finishOf(a)).toMatchObject({ timedOut: 'startup' });
  });
});
