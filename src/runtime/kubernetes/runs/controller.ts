/**
 * The run controller: informers on this instance's run Jobs and Pods, a keyed work queue (one
 * reconcile per execution at a time), and a reconcile pass that reads state, asks {@link decide}
 * what to do and applies it. Informer handlers only enqueue the execution id from a label.
 *
 * The API calls a reconcile pass makes are plain: a failed pass is retried by the work queue with
 * its own capped backoff, never through the service's circuit breaker (that one counts run attempts).
 */
import type { KubeConfig, V1Job, V1Pod } from '@kubernetes/client-node';
import { systemClock, type Clock } from '../../../clock.ts';
import { ReconnectingInformer, type KubeApi } from '../../../kube/index.ts';
import { silentLogger, type Logger } from '../../../logger.ts';
import type { RawRun, RunObservation } from '../../runtime.ts';
import { decide, type Action } from './decide.ts';
import { CONTAINERS, LABELS, instanceSelector } from '../names.ts';
import type { CollectedOutput } from './output-tar.ts';
import { ownerUids, type TrackedRun } from './tracked-run.ts';
export type { TrackedRun } from './tracked-run.ts';
import { collectOutputs, observeProgress, resolveRun, type OutputDeps } from './outputs.ts';
import { KeyedWorkQueue } from './work-queue.ts';
import { releaseByExec, releaseHeld, type ReleaseDeps } from './release.ts';
import { slimJob, slimPod } from './cache-transform.ts';

/** Options of {@link RunController}. */
export interface RunControllerOptions {
  kubeConfig: KubeConfig;
  api: KubeApi;
  namespace: string;
  instance: string;
  clock?: Clock;
  logger?: Logger;
  /** Collection attempts before the outputs are given up as lost. */
  collectAttempts?: number;
  /**
   * Collection attempts the API server did not take (no answer, 5xx) before the outputs are given up:
   * they say nothing of the pod, so many more are allowed (with the work queue's backoff, minutes).
   */
  collectUnavailableAttempts?: number;
  /** Time limit of one exec, ms. */
  execTimeoutMs?: number;
  informerBackoffInitialMs?: number;
  informerBackoffMaxMs?: number;
  watchTimeoutSeconds?: number;
  /** Deadline of a watch's response headers, ms (the API calls' own deadline is the KubeApi's). */
  requestTimeoutMs?: number;
}

/** How long a collect waits for the `done` of a warm run whose main is seen ended, ms. */
const DONE_WAIT_MS = 1000;

/** How long a resolved run waits for its log follow to deliver the end, ms. */
const LOG_TAIL_WAIT_MS = 2000;

/** See the module comment. */
export class RunController {
  readonly pods: ReconnectingInformer<V1Pod>;
  readonly jobs: ReconnectingInformer<V1Job>;
  private readonly queue: KeyedWorkQueue;
  private readonly runs = new Map<string, TrackedRun>();
  private readonly clock: Clock;
  private readonly log: Logger;
  private stopped = false;

  constructor(private readonly opts: RunControllerOptions) {
    this.clock = opts.clock ?? systemClock;
    this.log = opts.logger ?? silentLogger;
    const selector = instanceSelector(opts.instance);
    const common = {
      kubeConfig: opts.kubeConfig,
      labelSelector: selector,
      logger: this.log,
      ...(opts.informerBackoffInitialMs !== undefined ? { backoffInitialMs: opts.informerBackoffInitialMs } : {}),
      ...(opts.informerBackoffMaxMs !== undefined ? { backoffMaxMs: opts.informerBackoffMaxMs } : {}),
      ...(opts.watchTimeoutSeconds !== undefined ? { watchTimeoutSeconds: opts.watchTimeoutSeconds } : {}),
      requestTimeoutMs: opts.requestTimeoutMs ?? opts.api.requestTimeoutMs,
    };
    this.pods = new ReconnectingInformer<V1Pod>({
      ...common,
      name: 'pods',
      path: `/api/v1/namespaces/${opts.namespace}/pods`,
      list: () => opts.api.listPods(opts.namespace, selector),
      transform: slimPod,
      // A run's pods by its execution-id label: a reconcile finds them without scanning every pod.
      indexBy: (p) => p.metadata?.labels?.[LABELS.executionId],
    });
    this.jobs = new ReconnectingInformer<V1Job>({
      ...common,
      name: 'jobs',
      path: `/apis/batch/v1/namespaces/${opts.namespace}/jobs`,
      list: () => opts.api.listJobs(opts.namespace, selector),
      transform: slimJob,
      // An execution's Jobs by label: a new attempt finds one an earlier holder left (kubernetes-runtime.ts).
      indexBy: (j) => j.metadata?.labels?.[LABELS.executionId],
    });
    const enqueue = (o: V1Pod | V1Job) => {
      const key = o.metadata?.labels?.[LABELS.executionId];
      if (key && this.runs.has(key)) this.queue.add(key);
    };
    // One read from a watch can carry an object's ADDED and DELETED together: by the time a reconcile
    // pass looks at the cache it is gone, and "never seen" would wait for the startup timeout instead
    // of reporting the loss. A delete of an object the run had not seen yet marks it seen.
    this.pods.on((e, o) => {
      if (e === 'delete') this.noteDeleted(o, 'pod');
      enqueue(o);
    });
    this.jobs.on((e, o) => {
      if (e === 'delete') this.noteDeleted(o, 'job');
      enqueue(o);
    });
    this.queue = new KeyedWorkQueue((key) => this.reconcile(key), {
      onError: (key, err, retryInMs) =>
        this.log.warn({ execution_id: this.executionIdOf(key), err: String(err), retry_in_ms: retryInMs }, 'reconcile failed; will retry'),
    });
  }

  /** Starts both informers; resolves once their caches are synced. */
  async start(): Promise<void> {
    this.stopped = false;
    await Promise.all([this.pods.start(), this.jobs.start()]);
  }

  /** Stops watching; runs still tracked reject (the caller adopts them after a restart). */
  stop(): void {
    this.stopped = true;
    this.pods.stop();
    this.jobs.stop();
    this.queue.stop();
    for (const [key, run] of this.runs) {
      run.attach?.close();
      this.runs.delete(key);
      run.logFollow?.abort();
      run.reject(new Error('kubernetes runtime stopped while the run was in progress'));
    }
  }

  /** The execution id behind a label key (they differ only for ids that are not valid label values). */
  private executionIdOf(key: string): string {
    return this.runs.get(key)?.state.executionId ?? key;
  }

  /** Whether a run is being driven under this key. */
  has(key: string): boolean {
    return this.runs.has(key);
  }

  /** Number of runs in flight. */
  get inFlight(): number {
    return this.runs.size;
  }

  /** Drives a run until it resolves; `key` is the execution-id label value. */
  track(key: string, run: Omit<TrackedRun, 'resolve' | 'reject' | 'collectFailures' | 'deletedJobs' | 'deletedPods'>): Promise<RawRun> {
    return new Promise<RawRun>((resolve, reject) => {
      if (this.stopped) {
        reject(new Error('kubernetes runtime stopped before the run could be tracked'));
        return;
      }
      this.runs.set(key, { ...run, resolve, reject, collectFailures: 0, deletedJobs: new Set(), deletedPods: [] });
      this.queue.add(key);
    });
  }

  /** Tells the controller which Job is the run's (its uid), once created or found. */
  ownJob(key: string, jobUid: string): void {
    const run = this.runs.get(key);
    if (!run) return;
    run.jobUid = jobUid;
    this.resolveDeleted(run);
    this.queue.add(key);
  }

  /** Stops driving a run (its objects could not be created, or it was taken over); its `track()` promise rejects with `err`. */
  untrack(key: string, err: Error = new Error('the run was not started')): void {
    const run = this.runs.get(key);
    if (!run) return;
    run.attach?.close();
    this.runs.delete(key);
    this.queue.forget(key);
    run.logFollow?.abort();
    run.reject(err);
  }

  /** A warm run's program was handed over at `at` (its execution starts), by a hand-over begun at `since`. */
  delivered(key: string, at: number, since?: number): void {
    const run = this.runs.get(key);
    if (!run?.state.warm) return;
    run.state.warm.deliveredAt = at;
    if (since !== undefined) run.state.warm.handOverAt = since;
    this.queue.add(key);
  }

  /** A warm run's runner said `done N`: the program ended and its outputs are written. */
  done(key: string, exitCode: number, at: number): void {
    const run = this.runs.get(key);
    if (!run?.state.warm || run.state.warm.done) return;
    run.state.warm.done = { exitCode, at };
    run.doneHeard?.();
    this.queue.add(key);
  }

  /**
   * A warm run's collector is sending its outputs on the attach (deliver.py --output); `output`
   * settles after `done` with what was read (null: incomplete or unreadable). Taken, the run needs no
   * exec to collect, nor to release it (resolves true: the hand-over does, unless held). A
   * collect decided meanwhile waits for it. Not taken after a 137, which waits for the pod's status
   * (an OOM kill or not), and so for an exec'd collection, as before.
   */
  outputs(key: string, output: Promise<CollectedOutput | null>): Promise<boolean> {
    const run = this.runs.get(key);
    if (!run?.state.warm) return Promise.resolve(false);
    run.relayed = output.then(
      (o) => {
        if (!o || this.runs.get(key) !== run || run.state.collection || run.state.warm?.done?.exitCode === 137) return false;
        run.state.collection = { ok: true, output: o };
        run.state.released = true;
        this.queue.add(key);
        // Held (RunOptions.holdRelease): the line goes on this attach once the record is written.
        if (run.holdRelease) run.pendingRelease = { via: 'attach' };
        return true;
      },
      () => false,
    );
    return run.relayed.then((taken) => taken && !run.holdRelease);
  }

  /** Keeps a warm run's attach, to close it when the run ends. */
  setAttach(key: string, attach: NonNullable<TrackedRun['attach']>): void {
    const run = this.runs.get(key);
    if (run) run.attach = attach;
    else attach.close();
  }

  /** Marks a run cancelled and reconciles it. */
  cancel(key: string): void {
    const run = this.runs.get(key);
    if (!run) return;
    run.state.cancelRequested = true;
    this.queue.add(key);
  }

  private noteDeleted(o: V1Pod | V1Job, kind: 'pod' | 'job'): void {
    const key = o.metadata?.labels?.[LABELS.executionId];
    const run = key ? this.runs.get(key) : undefined;
    const uid = o.metadata?.uid;
    if (!run || !uid) return;
    if (kind === 'job') {
      if (o.metadata?.name === run.state.jobName) run.deletedJobs?.add(uid);
    } else if (!run.podUid) {
      run.deletedPods?.push({ uid, owners: ownerUids(o as V1Pod) });
    }
    this.resolveDeleted(run);
  }

  /** Applies the deletions heard so far once the run's Job is known: seen, then gone. */
  private resolveDeleted(run: TrackedRun): void {
    const jobUid = run.jobUid;
    if (!jobUid) return;
    if (run.deletedJobs?.has(jobUid)) run.state.jobSeen = true;
    if (!run.podUid) {
      const pod = run.deletedPods?.find((p) => p.owners.includes(jobUid));
      if (pod) {
        run.podUid = pod.uid;
        run.state.podSeen = true;
      }
    }
  }

  /** The run's Job from the cache: only the one with the run's uid (not an earlier attempt's). */
  private jobFor(run: TrackedRun): V1Job | undefined {
    const job = this.jobs.get(run.state.jobName);
    return job && run.jobUid !== undefined && job.metadata?.uid === run.jobUid ? job : undefined;
  }

  /** The run's pod: the first one its own Job made (a replacement pod is not the run's). */
  private podFor(key: string, run: TrackedRun): V1Pod | undefined {
    const pods = this.pods.byIndex(key);
    if (run.podUid) return pods.find((p) => p.metadata?.uid === run.podUid);
    const jobUid = run.jobUid;
    if (!jobUid) return undefined;
    const mine = pods.filter((p) => ownerUids(p).includes(jobUid));
    mine.sort((a, b) => String(a.metadata?.creationTimestamp ?? '').localeCompare(String(b.metadata?.creationTimestamp ?? '')));
    const pod = mine[0];
    if (pod?.metadata?.uid) {
      run.podUid = pod.metadata.uid;
      run.state.podSeen = true;
    }
    return pod;
  }

  private releaseDeps(): ReleaseDeps {
    return { api: this.opts.api, namespace: this.opts.namespace, log: this.log, ...(this.opts.execTimeoutMs !== undefined ? { execTimeoutMs: this.opts.execTimeoutMs } : {}) };
  }

  /** What the output functions (outputs.ts) use. */
  private outputDeps(): OutputDeps {
    return { ...this.opts, clock: this.clock, log: this.log };
  }

  private async reconcile(key: string): Promise<void> {
    // Applying an action can change the run's state (outputs pulled, collector released); decide
    // again at once rather than waiting for the next event.
    for (let pass = 0; pass < 8; pass++) {
      const run = this.runs.get(key);
      if (!run || run.state.finished) return;
      const job = this.jobFor(run);
      if (job) run.state.jobSeen = true;
      const pod = this.podFor(key, run);
      observeProgress(this.outputDeps(), run, pod);
      const actions = decide(run.state, job, pod, this.clock.now());
      let again = false;
      for (const action of actions) {
        if (await this.apply(key, run, action)) again = true;
      }
      if (!again) return;
    }
  }

  /** Applies one action; true when the run's state changed so that deciding again may differ. */
  private async apply(key: string, run: TrackedRun, action: Action): Promise<boolean> {
    const ns = this.opts.namespace;
    switch (action.type) {
      case 'enterExecution':
        run.state.phaseReported = 'execution';
        run.state.mainStartedAt = action.mainStartedAt;
        try {
          run.onPhase?.('execution');
        } catch (err) {
          this.log.warn({ execution_id: run.state.executionId, err: String(err) }, 'onPhase threw');
        }
        return false;
      case 'wakeAt':
        this.queue.addAfter(key, Math.max(1, action.at - this.clock.now()));
        return false;
      case 'notePodGone':
        run.state.podGoneAt = action.at;
        return false;
      case 'deleteJob':
        // By uid once known: after a takeover, the new holder's Job of the same name is not ours to hit.
        await this.opts.api.deleteJob(ns, run.state.jobName, run.jobUid || undefined);
        run.state.jobDeleted = true;
        return false;
      case 'fetchDepsLog':
        run.state.depsLog = await this.opts.api.podLogTail(ns, action.pod, CONTAINERS.deps);
        return true;
      case 'collect':
        // The pod's status can show main ended before the runner's `done` (and the outputs before it)
        // came through the attach: a moment for them, then an exec only if they do not arrive whole.
        if (run.state.warm && !run.state.warm.done) {
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, DONE_WAIT_MS);
            run.doneHeard = () => {
              clearTimeout(timer);
              resolve();
            };
          });
        }
        if (run.relayed && (await run.relayed)) return true;
        await collectOutputs(this.outputDeps(), run, action.pod, action.early ?? false);
        return true;
      case 'release':
        // The outputs are in, so the run's outcome is known: the collector is let go in the background
        // and the run reports at once (awaiting the exec put a second exec round trip on every cold
        // run's report, its tail under load). A collector we cannot reach ends with the Job's deadline.
        // Held (RunOptions.holdRelease): only once the caller wrote the record (release.ts).
        run.state.released = true;
        if (run.holdRelease) run.pendingRelease = { via: 'exec', pod: action.pod };
        else releaseByExec(this.releaseDeps(), run.state.executionId, action.pod);
        return true;
      case 'finish':
        this.finish(key, run, action.observation);
        return false;
    }
  }


  private finish(key: string, run: TrackedRun, observation: RunObservation): void {
    run.state.finished = true;
    const held = run.pendingRelease;
    if (held && !held.pod) held.pod = this.podFor(key, run)?.metadata?.name;
    // A held release goes on the attach later (RawRun.letGo); otherwise it is closed now.
    if (held?.via !== 'attach') run.attach?.close();
    const letGo = held ? () => releaseHeld(this.releaseDeps(), run) : undefined;
    this.runs.delete(key);
    this.queue.forget(key);
    const follow = run.logFollow;
    if (follow && !observation.cancelled) {
      // The server ends the log when `main` ends, which was before the outputs were collected; a
      // follow still open (a slow API) gets a moment to deliver the tail before the run resolves.
      let timer: NodeJS.Timeout | undefined;
      void Promise.race([follow.done, new Promise((r) => (timer = setTimeout(r, LOG_TAIL_WAIT_MS)))]).then(() => {
        clearTimeout(timer);
        follow.abort();
        resolveRun(this.log, run, observation, letGo);
      });
      return;
    }
    follow?.abort();
    resolveRun(this.log, run, observation, letGo);
  }
}
