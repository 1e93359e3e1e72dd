/**
 * `decide` on objects that are not filled in yet: a raw watch event can carry a Pod without a
 * `status`, a status without container lists, container statuses without a `state`, a Job without
 * a `status`. Each must read as "not started / nothing known" — the same decision as for the absent
 * parts — never a TypeError that stops the controller's loop for the run.
 */
import type { V1ContainerStatus, V1Job, V1Pod } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { decide, mainOomKilled, newRunState, observe, type RunState } from '../../../../src/runtime/kubernetes/runs/decide.ts';
import { emptyOutput } from '../../../../src/runtime/kubernetes/runs/output-tar.ts';

const T0 = Date.parse('2026-01-01T00:00:00Z');
const S = 1000;
const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z') as unknown as Date;

function run(over: Partial<RunState> = {}): RunState {
  return newRunState({ executionId: 'e1', jobName: 'sp-run', startedAt: T0, startupTimeoutMs: 60 * S, podGoneGraceMs: 3 * S, jobSeen: true, podSeen: true, ...over });
}

const bare = (name: string) => ({ name }) as V1ContainerStatus;
const pod = (status?: V1Pod['status']): V1Pod => ({ metadata: { name: 'sp-run-x' }, ...(status ? { status } : {}) });
const jobWithoutStatus: V1Job = { metadata: { name: 'sp-run' } };
const terminated = (name: string, exitCode: number, reason: string): V1ContainerStatus =>
  ({ name, state: { terminated: { exitCode, reason, startedAt: iso(T0 + 2 * S), finishedAt: iso(T0 + 4 * S) } } }) as V1ContainerStatus;

describe('decide on objects not filled in yet', () => {
  it.each<[string, V1Pod]>([
    ['a pod without a status', pod()],
    ['a status without container lists', pod({ phase: 'Pending' })],
    ['container statuses without a state', pod({ phase: 'Pending', containerStatuses: [bare('main'), bare('collector')], initContainerStatuses: [bare('deps')] })],
  ])('%s: not started, wait for the startup deadline', (_name, p) => {
    const r = run();
    expect(decide(r, jobWithoutStatus, p, T0 + S)).toEqual([{ type: 'wakeAt', at: T0 + 60 * S }]);
    expect(mainOomKilled(p)).toBe(false);
    expect(observe(r, p, T0 + S)).toMatchObject({ phase: 'startup', exitCode: null, oomKilled: false, startupMs: S, depInstallMs: 0, executionMs: 0 });
  });

  it('past the startup deadline with such a pod: the startup timeout', () => {
    const a = decide(run(), jobWithoutStatus, pod({ containerStatuses: [bare('main'), bare('collector')] }), T0 + 61 * S);
    expect(a.map((x) => x.type)).toEqual(['deleteJob', 'finish']);
  });

  it('main ended with 137 while the other containers have no state yet: not memory; wait for the collector', () => {
    const p = pod({ phase: 'Running', containerStatuses: [terminated('main', 137, 'Error'), bare('collector')], initContainerStatuses: [bare('deps')] });
    expect(mainOomKilled(p)).toBe(false);
    expect(decide(run(), jobWithoutStatus, p, T0 + 5 * S)).toEqual([{ type: 'enterExecution', mainStartedAt: T0 + 2 * S }]);
  });

  it('main OOM-killed with a collector that has no state yet and a Job without status: waits for the collector', () => {
    const p = pod({ phase: 'Running', containerStatuses: [terminated('main', 137, 'OOMKilled'), bare('collector')] });
    expect(mainOomKilled(p)).toBe(true);
    expect(decide(run({ phaseReported: 'execution' }), jobWithoutStatus, p, T0 + 5 * S)).toEqual([]);
  });
});

describe('decide with containers missing from the lists, or without a state', () => {
  const output = emptyOutput();

  it('main ended with 137, the collector not listed yet: not memory; wait for the collector', () => {
    const p = pod({ phase: 'Running', containerStatuses: [terminated('main', 137, 'Error')] });
    expect(mainOomKilled(p)).toBe(false);
    expect(decide(run(), jobWithoutStatus, p, T0 + 5 * S)).toEqual([{ type: 'enterExecution', mainStartedAt: T0 + 2 * S }]);
  });

  it('main OOM-killed, the collector not listed yet: waits for it', () => {
    const p = pod({ phase: 'Running', containerStatuses: [terminated('main', 137, 'OOMKilled')] });
    expect(decide(run({ phaseReported: 'execution' }), jobWithoutStatus, p, T0 + 5 * S)).toEqual([]);
  });

  it.each<[string, V1ContainerStatus[]]>([
    ['not listed', [terminated('main', 0, 'Completed')]],
    ['without a state', [terminated('main', 0, 'Completed'), bare('collector')]],
  ])('outputs collected, the collector %s: nothing to release, finish', (_name, list) => {
    const r = run({ phaseReported: 'execution', collection: { ok: true, output } });
    const a = decide(r, jobWithoutStatus, pod({ phase: 'Running', containerStatuses: list }), T0 + 5 * S);
    expect(a.map((x) => x.type)).toEqual(['finish']);
  });

  it.each<[string, V1ContainerStatus[]]>([
    ['not listed', []],
    ['without a state', [bare('main')]],
  ])('deps cannot start (StartError), main %s: docker_error at once', (_name, list) => {
    const p = pod({ phase: 'Pending', initContainerStatuses: [terminated('deps', 128, 'StartError')], containerStatuses: list });
    const a = decide(run(), jobWithoutStatus, p, T0 + 5 * S);
    expect(a.map((x) => x.type)).toEqual(['deleteJob', 'finish']);
    expect(a[1]).toMatchObject({ observation: { infraError: { type: 'docker_error', message: 'deps: StartError:' } } });
  });

  it.each<[string, V1ContainerStatus]>([
    ['running without a start time', { name: 'deps', state: { running: {} } } as V1ContainerStatus],
    ['ended without a start time', { name: 'deps', state: { terminated: { exitCode: 0, finishedAt: iso(T0 + 4 * S) } } } as V1ContainerStatus],
  ])('deps %s: no dependency install time is made up', (_name, deps) => {
    const p = pod({ phase: 'Pending', initContainerStatuses: [deps], containerStatuses: [bare('main'), bare('collector')] });
    expect(observe(run(), p, T0 + 5 * S).depInstallMs).toBe(0);
  });
});

describe('decide on a pod without metadata', () => {
  const noMeta = (status: V1Pod['status']): V1Pod => ({ status });
  const running = (name: string, ms: number): V1ContainerStatus => ({ name, state: { running: { startedAt: iso(ms) } } }) as V1ContainerStatus;

  it('main running: the execution phase, not a deleted pod', () => {
    const a = decide(run(), jobWithoutStatus, noMeta({ phase: 'Running', containerStatuses: [running('main', T0 + 2 * S), running('collector', T0 + 2 * S)] }), T0 + 3 * S);
    expect(a).toEqual([{ type: 'enterExecution', mainStartedAt: T0 + 2 * S }]);
  });

  it('main OOM-killed, collector running: collect as usual', () => {
    const a = decide(run({ phaseReported: 'execution' }), jobWithoutStatus, noMeta({ phase: 'Running', containerStatuses: [terminated('main', 137, 'OOMKilled'), running('collector', T0 + 2 * S)] }), T0 + 5 * S);
    expect(a.map((x) => x.type)).toEqual(['collect']);
  });

  it('outputs collected, collector running: release it', () => {
    const r = run({ phaseReported: 'execution', collection: { ok: false, error: 'exec refused' } });
    const a = decide(r, jobWithoutStatus, noMeta({ phase: 'Running', containerStatuses: [terminated('main', 0, 'Completed'), running('collector', T0 + 2 * S)] }), T0 + 5 * S);
    expect(a.map((x) => x.type)).toEqual(['release']);
  });
});
