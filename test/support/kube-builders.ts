/**
 * Builders of run Pods and Jobs for table tests of `decide`:
 * `makePod().mainRunning(t).obj()`, `makePod().phase('Failed').evicted().obj()`, `makeJob().deadlineExceeded().obj()`.
 */
import type { V1ContainerStatus, V1Job, V1Pod } from '@kubernetes/client-node';

const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');

/** Fluent builder of a run pod (containers `main`, `collector`, optional init `deps`). */
export class PodBuilder {
  private pod: V1Pod;

  constructor(name = 'sp-run-abcde') {
    this.pod = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name, namespace: 'sandpod-jobs', uid: `uid-${name}`, labels: { 'job-name': 'sp-run' } },
      spec: { containers: [{ name: 'main' }, { name: 'collector' }] },
      status: {
        phase: 'Pending',
        containerStatuses: [waiting('main', 'ContainerCreating'), waiting('collector', 'ContainerCreating')],
      },
    };
  }

  phase(p: string): this {
    this.pod.status!.phase = p;
    return this;
  }

  /** Scheduled onto a node (its containers may start before their status says so). */
  bound(node = 'node-1'): this {
    this.pod.spec!.nodeName = node;
    return this;
  }

  withDeps(): this {
    this.pod.spec!.initContainers = [{ name: 'deps' }];
    this.pod.status!.initContainerStatuses = [waiting('deps', 'PodInitializing')];
    return this;
  }

  private set(name: string, s: V1ContainerStatus): this {
    const init = name === 'deps';
    const key = init ? 'initContainerStatuses' : 'containerStatuses';
    const list = (this.pod.status![key] ??= []);
    const i = list.findIndex((c) => c.name === name);
    if (i >= 0) list[i] = s;
    else list.push(s);
    return this;
  }

  waiting(container: string, reason: string, message?: string): this {
    return this.set(container, waiting(container, reason, message));
  }

  running(container: string, startedAtMs: number): this {
    return this.set(container, { name: container, image: 'x', imageID: '', ready: true, restartCount: 0, state: { running: { startedAt: iso(startedAtMs) as unknown as Date } } });
  }

  terminated(container: string, exitCode: number, reason: string, startedAtMs: number, finishedAtMs: number): this {
    return this.set(container, {
      name: container,
      image: 'x',
      imageID: '',
      ready: false,
      restartCount: 0,
      state: { terminated: { exitCode, reason, startedAt: iso(startedAtMs) as unknown as Date, finishedAt: iso(finishedAtMs) as unknown as Date } },
    });
  }

  /** `main` and `collector` running since `t`. */
  mainRunning(t: number): this {
    return this.phase('Running').running('main', t).running('collector', t);
  }

  /** `main` ended at `end` with an exit code and reason; the collector still holds /output. */
  mainTerminated(exitCode: number, reason: string, start: number, end: number): this {
    return this.phase('Running').terminated('main', exitCode, reason, start, end).running('collector', start);
  }

  unschedulable(): this {
    this.pod.status!.conditions = [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message: '0/1 nodes are available' }];
    return this;
  }

  evicted(): this {
    this.pod.status!.phase = 'Failed';
    this.pod.status!.reason = 'Evicted';
    this.pod.status!.message = 'The node was low on resource: ephemeral-storage.';
    return this;
  }

  deleting(): this {
    this.pod.metadata!.deletionTimestamp = new Date();
    return this;
  }

  obj(): V1Pod {
    return structuredClone(this.pod);
  }
}

function waiting(name: string, reason: string, message?: string): V1ContainerStatus {
  return { name, image: 'x', imageID: '', ready: false, restartCount: 0, state: { waiting: { reason, ...(message ? { message } : {}) } } };
}

/** Fluent builder of a run Job. */
export class JobBuilder {
  private job: V1Job = { apiVersion: 'batch/v1', kind: 'Job', metadata: { name: 'sp-run', namespace: 'sandpod-jobs', uid: 'job-uid' }, spec: { template: {} }, status: { active: 1 } };

  deadlineExceeded(): this {
    this.job.status = { failed: 1, conditions: [{ type: 'Failed', status: 'True', reason: 'DeadlineExceeded', message: 'Job was active longer than specified deadline' }] };
    return this;
  }

  complete(): this {
    this.job.status = { succeeded: 1, conditions: [{ type: 'Complete', status: 'True' }] };
    return this;
  }

  obj(): V1Job {
    return structuredClone(this.job);
  }
}

/** A new pod builder. */
export const makePod = (name?: string): PodBuilder => new PodBuilder(name);
/** A new job builder. */
export const makeJob = (): JobBuilder => new JobBuilder();
