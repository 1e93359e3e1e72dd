/** The cluster steps of a run's trace from the run's state and its pod (runs/trace-steps.ts), table-tested. */
import type { V1Pod } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { newRunState, type RunState } from '../../../../src/runtime/kubernetes/runs/decide.ts';
import { observedSteps } from '../../../../src/runtime/kubernetes/runs/trace-steps.ts';

const T0 = Date.parse('2026-12-01T10:00:00.250Z');
const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');

function run(over: Partial<RunState> = {}): RunState {
  return newRunState({ executionId: 'e1', jobName: 'sp-run-e1', startedAt: T0, startupTimeoutMs: 60_000, podGoneGraceMs: 3000, ...over });
}

function pod(o: { created?: number; scheduled?: number; unschedulable?: boolean; node?: string } = {}): V1Pod {
  return {
    metadata: { name: 'sp-run-e1-x', ...(o.created !== undefined ? { creationTimestamp: iso(o.created) as unknown as Date } : {}) },
    spec: { containers: [], ...(o.node ? { nodeName: o.node } : {}) },
    status: {
      conditions: [
        ...(o.scheduled !== undefined ? [{ type: 'PodScheduled', status: 'True', lastTransitionTime: iso(o.scheduled) as unknown as Date }] : []),
        ...(o.unschedulable ? [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable' }] : []),
      ],
    },
  };
}

/** `name start..end` relative to T0, ms. */
const steps = (r: RunState, p: V1Pod | undefined) => observedSteps(r, p).map((s) => `${s.name} ${s.start.getTime() - T0}..${s.end.getTime() - T0}`);

describe('observedSteps', () => {
  it.each([
    ['no pod yet: nothing', run(), undefined, []],
    ['a pod made for the run, not scheduled: its create only', run(), pod({ created: T0 + 1750 }), ['sandpod.kube.create 0..1750']],
    ['unschedulable: no scheduling span until PodScheduled is True', run(), pod({ created: T0 + 1750, unschedulable: true }), ['sandpod.kube.create 0..1750']],
    ['scheduled: create, then the scheduling wait', run(), pod({ created: T0 + 750, scheduled: T0 + 3750, node: 'n1' }), ['sandpod.kube.create 0..750', 'sandpod.kube.schedule 750..3750']],
    // Whole seconds: a pod created in the run's first second reads as before its start.
    ['a creation time truncated before the start: a zero create', run(), pod({ created: T0, scheduled: T0 }), ['sandpod.kube.create 0..0', 'sandpod.kube.schedule 0..0']],
    ['cold-attach: create, schedule, and the hand-over', run({ warm: { deliveredAt: T0 + 5000, done: null, handOverAt: T0 + 4000 } }), pod({ created: T0 + 750, scheduled: T0 + 1750 }), ['sandpod.kube.create 0..750', 'sandpod.kube.schedule 750..1750', 'sandpod.kube.attach 4000..5000']],
    ['a claimed pool pod: only the hand-over (the pod predates the run)', run({ claimed: true, warm: { deliveredAt: T0 + 90, done: null, handOverAt: T0 + 20 } }), pod({ created: T0 - 600_000, scheduled: T0 - 599_000 }), ['sandpod.kube.attach 20..90']],
    ['not delivered yet: no attach span', run({ claimed: true, warm: { deliveredAt: null, done: null } }), pod({ created: T0 - 600_000 }), []],
    ['delivered with no hand-over start known (adopted): from the run\'s start', run({ claimed: true, warm: { deliveredAt: T0 + 40, done: null } }), undefined, ['sandpod.kube.attach 0..40']],
  ])('%s', (_name, r, p, want) => {
    expect(steps(r, p)).toEqual(want);
  });

  it('names the Job, the pod, the node and the path', () => {
    const [create, schedule] = observedSteps(run(), pod({ created: T0 + 750, scheduled: T0 + 1750, node: 'n1' }));
    expect(create?.attributes).toEqual({ 'k8s.job.name': 'sp-run-e1', 'k8s.pod.name': 'sp-run-e1-x' });
    expect(schedule?.attributes).toEqual({ 'k8s.job.name': 'sp-run-e1', 'k8s.pod.name': 'sp-run-e1-x', 'k8s.node.name': 'n1' });
    const [attach] = observedSteps(run({ claimed: true, warm: { deliveredAt: T0 + 90, done: null } }), pod());
    expect(attach?.attributes).toMatchObject({ 'sandpod.kube.path': 'warm' });
  });
});
