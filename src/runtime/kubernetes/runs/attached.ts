/**
 * The two paths of a run whose program goes by attach (runs/hand-over.ts): a claimed warm pool pod
 * (pool.ts), and a cold pod made the same way (`kubernetes.cold_start: attach`, pool-plan.ts
 * `coldAttachJob`). Both pods have the same mounts as a cold run's (/code and /input read-only to
 * the program); they differ from it only in who writes those volumes. A hand-over that fails before
 * the program started is retried as `afterHandOverFailure` (decide.ts) says.
 */
import type { V1Job } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import { upgradeRefused, type KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import { assertHeld, FencedError, LeftRunningError, type RawRun, type RunOptions, type RunSpec } from '../../runtime.ts';
import type { RunController } from './controller.ts';
import { afterHandOverFailure, newRunState } from './decide.ts';
import { CONTAINERS, LABELS, jobNameFor } from '../names.ts';
import { PodClaims } from './claim.ts';
import { defaultOutputLimits } from './output-tar.ts';
import { coldAttachJob } from '../pool/pool-plan.ts';
import type { RunnerSources } from './runner-sources.ts';
import type { WarmPool } from '../pool/pool.ts';
import { egressProxyUrlFor } from './build-job.ts';
import type { EgressCredentials } from './egress.ts';
import { AttachEndedError, handOver, HandOverError, openCollector, type CollectorAttach } from './hand-over.ts';

/** How often a cold attach run tries to attach before the kubelet reports the collector running, ms. */
const EARLY_ATTACH_INTERVAL_MS = 40;
/**
 * How long a program may take to start once its payload was sent (the runner answers `execution`), ms.
 * A warm pod's runner already listens, so this is about a broken pod. A cold attach pod's collector
 * may get the payload while `main` is still starting: its hand-over may last until the run's startup
 * limit instead (the controller ends the run with `startup_timeout` there).
 */
const HAND_OVER_TIMEOUT_MS = 30_000;
/** How long attaches refused while the pod's status says the collector runs are retried, ms (see deliverWhenRunning). */
const REFUSED_WHILE_RUNNING_MS = 3000;

/** What the attach paths need from the runtime. */
export interface AttachedRunsDeps {
  api: KubeApi;
  controller: RunController;
  pool: () => WarmPool | null;
  config: Config;
  clock: Clock;
  log: Logger;
  /** The runner and deliver.py: made sure of before a cold attach Job, whose pod mounts them. */
  sources: RunnerSources;
  /** The egress proxy's credentials: a proxied run's go line carries its own. */
  egress: EgressCredentials;
  /** Creates the run's Job, or takes the one of the same name an earlier attempt made (409). */
  ensureJob: (job: V1Job, jobName: string) => Promise<V1Job>;
  podGoneGraceMs?: number;
  handOverTimeoutMs?: number;
}

/**
 * Waits for a tracked run; an abort from here on cancels it (the controller deletes its Job), except
 * an abort because the run was taken over (`fenced`), or because the service stops and gives it back
 * (`shutdown`, with `leaveOnShutdown`): this process lets go of the run and leaves its Job and pod to
 * the next holder, which re-attaches to them (a program that started is not run again).
 */
export async function awaitTracked(controller: RunController, key: string, tracked: Promise<RawRun>, options: Pick<RunOptions, 'signal' | 'leaveOnShutdown'>): Promise<RawRun> {
  const signal = options.signal;
  const onAbort = () => {
    if (signal?.reason === 'fenced') controller.untrack(key, new FencedError('the run was taken over by another process; its Job is left to it'));
    else if (signal?.reason === 'shutdown' && options.leaveOnShutdown) controller.untrack(key, new LeftRunningError('the service stopped; the run\'s Job is left running for its next holder'));
    else controller.cancel(key);
  };
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    if (signal?.aborted) onAbort();
    return await tracked;
  } finally {
    signal?.removeEventListener('abort', onAbort);
  }
}

/**
 * Why a program must not be sent now, with the attach to its pod just opened (hand-over.ts
 * `stopBeforeSending`): the run was taken over, given back on shutdown, or is no longer driven here
 * (`tracked` false: untracked meanwhile, as a cold run taken over or given back is by its abort
 * listener; a warm run has none until its program went, hence the signal). Null: send it. A cancel is
 * not among them: the run stays tracked, the program goes, and it is cancelled as any running run.
 */
function givenUp(options: Pick<RunOptions, 'signal' | 'leaveOnShutdown'>, tracked: boolean): Error | null {
  const reason = options.signal?.aborted ? options.signal.reason : null;
  if (reason === 'fenced' || !tracked) return new FencedError('the run was no longer this process\'s when the attach to its collector opened; nothing was sent');
  if (reason === 'shutdown' && options.leaveOnShutdown) return new LeftRunningError('the service stopped while the attach to the run\'s collector opened; nothing was sent, the run is left to its next holder');
  return null;
}

/** The warm and cold-attach paths (see the module comment). */
export class AttachedRuns {
  private readonly ns: string;
  /** What each attach pod's claim says of its program (claim.ts). */
  readonly claims: PodClaims;

  constructor(private readonly d: AttachedRunsDeps) {
    this.ns = d.config.kubernetes.runs_namespace;
    this.claims = new PodClaims({ api: d.api, ns: this.ns, clock: d.clock, log: d.log });
  }

  /**
   * The warm path: claims a pool pod, hands the program over and drives the run like any other; the
   * runner's `done N` ends it without waiting for the kubelet. Null on a miss, or when hand-overs
   * failed until `afterHandOverFailure` says cold (each claimed Job is deleted; the caller starts cold).
   * A Job: a hand-over failed as this process saw it but the program started there (the caller
   * follows that Job as it would an adopted one).
   */
  async runWarm(spec: RunSpec, options: RunOptions, key: string, startedAt: number): Promise<RawRun | V1Job | null> {
    const pool = this.d.pool();
    if (!pool) return null;
    for (let failures = 0; ; ) {
      // Claiming labels a pool Job with the execution: only while the run is surely ours.
      await assertHeld(options, 'claiming a warm pod');
      // The attach to each candidate's collector begins with its claim's patch (they overlap); the
      // program goes on it only once the claim won (hand-over.ts, openCollector).
      const claim = await pool.claim(spec, (podName) => openCollector(this.d.api, this.ns, podName));
      if (!claim) return null;
      const jobName = claim.job.metadata?.name ?? '';
      const podName = claim.pod.metadata?.name ?? '';
      const tracked = this.track(spec, options, key, jobName, startedAt, {
        jobSeen: true,
        claimed: true,
        ...(claim.job.metadata?.uid ? { jobUid: claim.job.metadata.uid } : {}),
        ...(claim.pod.metadata?.uid ? { podUid: claim.pod.metadata.uid } : {}),
      });
      tracked.catch(() => undefined);
      // The pod is known by uid already; its labels (for kubectl and other replicas) may come later.
      claim.labelled.catch((err: unknown) => this.d.log.warn({ execution_id: spec.executionId, pod: podName, err: String(err) }, 'could not label the claimed pod'));
      try {
        await assertHeld(options, 'handing the program over');
        await this.deliver(key, podName, spec, options, undefined, claim.early);
      } catch (err) {
        if (err instanceof FencedError || err instanceof LeftRunningError) {
          // Taken over (or given back) with the pod claimed but empty: its next holder finds it (by label) and decides.
          this.d.controller.untrack(key, err);
          throw err;
        }
        this.d.controller.untrack(key);
        // Failed as this process saw it (no answer in time, the attach cut), yet the program may have
        // started: then it is followed there, never started again elsewhere.
        const claimed = await this.claims.of(podName, spec.executionId);
        if (claimed !== 'never') {
          this.d.log.warn({ execution_id: spec.executionId, job: jobName, err: String(err), claim: claimed }, 'the hand-over failed but the program started in the warm pod (or may have); following it there');
          return claim.job;
        }
        failures++;
        const next = afterHandOverFailure('warm', failures);
        this.d.log.warn({ execution_id: spec.executionId, job: jobName, err: String(err), failures, next }, 'could not hand the program to a warm pod; trying again');
        pool.noteHandOverRetry(spec.jobType.name);
        await this.d.api.deleteJob(this.ns, jobName, claim.job.metadata?.uid).catch(() => undefined);
        if (next !== 'warm') return null;
        continue;
      }
      try {
        return await awaitTracked(this.d.controller, key, tracked, options);
      } finally {
        // The pool may refill now: the run no longer competes with a starting pod.
        pool.runOver(jobName);
      }
    }
  }

  /**
   * A cold run made like a warm one: its Job is a pool Job named after the execution; once the
   * collector runs, the program goes through attach and the runner's `done` line ends the run. No
   * Secret. Startup is until the hand-over.
   */
  async runColdAttach(spec: RunSpec, options: RunOptions, key: string, startedAt: number, runtimeClassName: string | null): Promise<RawRun> {
    const jobName = jobNameFor(spec.executionId);
    const job = coldAttachJob(spec, this.d.config, {
      name: jobName,
      runtimeClassName,
      sources: this.d.sources.name(),
      graceSec: this.d.config.kubernetes.deadline_grace_seconds,
    });
    const tracked = this.track(spec, options, key, jobName, startedAt, {});
    let settled = false;
    tracked.then(
      () => (settled = true),
      () => (settled = true),
    );
    let owner: V1Job;
    try {
      await assertHeld(options, 'creating its Job');
      await this.d.sources.ensure();
      owner = await this.d.ensureJob(job, jobName);
      this.d.controller.ownJob(key, owner.metadata?.uid ?? '');
    } catch (err) {
      this.d.controller.untrack(key);
      throw err;
    }
    // The abort listener is in place (awaitTracked's synchronous start) before delivery begins.
    const waiting = awaitTracked(this.d.controller, key, tracked, options);
    // Hand the program over as soon as the collector runs; the controller meanwhile watches for
    // startup failures (image errors, the startup timeout) and ends the run on its own.
    void this.deliverWhenRunning(spec, options, key, owner.metadata?.uid ?? '', startedAt, () => settled);
    return await waiting;
  }

  /**
   * For adoption: whether the program of a Job whose program goes by attach was handed over; false
   * means no program ever runs in its pod. Null for a Job whose program came in a Secret; false
   * when its pod is not there (in the cache, nor when the API server is asked: a loaded watch lags).
   * Otherwise the pod's claim decides (claim.ts): the hand-over of the process that held the
   * run may still be in flight (it stalled, or died with its bytes on the way, or the runner is not up
   * yet), and the claim is taken for `fence` here unless deliver.py took it to send the go line. With
   * no answer, the pod is followed: a run that ends without its program is a failure the client sees,
   * a program run twice is not.
   */
  async handedOver(job: V1Job, executionId: string): Promise<boolean | null> {
    const collector = job.spec?.template.spec?.containers.find((c) => c.name === CONTAINERS.collector);
    if (!collector?.stdin) return null;
    const uid = job.metadata?.uid;
    if (!uid) return false;
    const cached = this.d.controller.pods.list().find((p) => p.metadata?.ownerReferences?.some((r) => r.uid === uid));
    const podName = cached?.metadata?.name ?? (await this.d.api.listPods(this.ns, `controller-uid=${uid}`)).items[0]?.metadata?.name;
    if (!podName) return false;
    return (await this.claims.of(podName, executionId, !collector.command?.includes('--claim'))) !== 'never';
  }

  /** Starts driving a run whose program goes by attach. */
  private track(spec: RunSpec, options: RunOptions, key: string, jobName: string, startedAt: number, known: { jobSeen?: boolean; claimed?: boolean; jobUid?: string; podUid?: string }): Promise<RawRun> {
    const { jobSeen, claimed, ...uids } = known;
    return this.d.controller.track(key, {
      state: newRunState({
        executionId: spec.executionId,
        jobName,
        startedAt,
        startupTimeoutMs: spec.startupTimeoutSec * 1000,
        podGoneGraceMs: this.d.podGoneGraceMs ?? 3000,
        ...(jobSeen ? { jobSeen } : {}),
        ...(claimed ? { claimed } : {}),
        warm: { deliveredAt: null, done: null },
      }),
      limits: defaultOutputLimits(spec.maxArtifactBytes, spec.maxStdoutBytes),
      ...(options.onPhase ? { onPhase: options.onPhase } : {}),
      ...(options.holdRelease ? { holdRelease: true } : {}),
      ...uids,
    });
  }

  /** Hands the program to `podName`'s collector; the run's execution starts when the runner says so. */
  private async deliver(key: string, podName: string, spec: RunSpec, options: RunOptions, startupEndsAt?: number, opened?: CollectorAttach): Promise<void> {
    const since = this.d.clock.now();
    // Signed now, for this run only: the pod was made before the run existed.
    const creds = await this.d.egress.forJob(spec);
    const session = await handOver(this.d.api, this.ns, podName, spec, {
      ...(creds ? { proxy: egressProxyUrlFor(spec, this.d.config, creds) } : {}),
      timeoutMs: Math.max(this.d.handOverTimeoutMs ?? HAND_OVER_TIMEOUT_MS, (startupEndsAt ?? 0) - since),
      limits: defaultOutputLimits(spec.maxArtifactBytes, spec.maxStdoutBytes),
      onDone: (exitCode) => this.d.controller.done(key, exitCode, this.d.clock.now()),
      onOutputs: (output) => this.d.controller.outputs(key, output),
      stopBeforeSending: () => givenUp(options, this.d.controller.has(key)),
    }, opened);
    this.d.controller.setAttach(key, session);
    this.d.controller.delivered(key, this.d.clock.now(), since);
  }

  /** The program never reached the cold pod: the attempt fails (the service retries it) and its Job goes. */
  private async failColdHandOver(spec: RunSpec, key: string, jobUid: string, err: unknown, podName = ''): Promise<void> {
    this.d.log.warn({ execution_id: spec.executionId, err: String(err), next: afterHandOverFailure('cold-attach', 1) }, 'could not hand the program to the run pod');
    this.d.controller.untrack(key, err instanceof Error ? err : new Error(String(err)));
    // It started after all (the hand-over's answer was lost or late): the Job stays, and the retry
    // finds it (earlierJob) and follows it.
    const claimed = await this.claims.of(podName, spec.executionId);
    if (claimed !== 'never') {
      this.d.log.warn({ execution_id: spec.executionId, pod: podName, claim: claimed }, 'the hand-over failed but the program started in the run pod (or may have); its Job stays for the retry to follow');
      return;
    }
    // By uid: the service's retry creates a Job of the same name, which this must never hit.
    await this.d.api.deleteJob(this.ns, jobNameFor(spec.executionId), jobUid || undefined).catch(() => undefined);
  }

  /**
   * Hands the program over as soon as the collector can take it. The kubelet reports a container
   * running only at its next status sync (up to a second after the start), but attach asks the
   * container runtime itself: so once the pod is bound to a node, attach is tried every
   * {@link EARLY_ATTACH_INTERVAL_MS} before the status says so. A refused attach (the container is not
   * running yet) opened no stream, so it leaves the `stdinOnce` stdin untouched and may be repeated;
   * once the status says running, a failure is final, but for refusals in the first moment (the
   * container has just ended; its status, a moment later, says how) and for an attach that ended
   * before the program started (the same: the collector's end, once reported, is the cause given).
   */
  private async deliverWhenRunning(spec: RunSpec, options: RunOptions, key: string, jobUid: string, startedAt: number, settled: () => boolean): Promise<void> {
    const c = this.d.controller;
    let lastTry = Number.NEGATIVE_INFINITY;
    let refusedSince: number | null = null;
    // An attach that ended with nothing started: the collector's status, a moment later, may say why.
    let ended: { at: number; err: unknown; pod: string } | null = null;
    // Woken by any change of this run's pod, so the loop does not poll the pod cache.
    let wake: (() => void) | null = null;
    const off = c.pods.on((_event, p) => {
      if (p.metadata?.labels?.[LABELS.executionId] === key) wake?.();
    });
    try {
      while (!settled()) {
        const pod = c.pods.byIndex(key).find((p) => p.metadata?.ownerReferences?.some((r) => r.uid === jobUid));
        const status = (n: string) => pod?.status?.containerStatuses?.find((s) => s.name === n);
        // A collector that ended before the hand-over can take no program any more (deliver.py exits 3
        // when its stdin closed before a byte came): the attempt fails now, not at the startup limit.
        const collectorEnd = status(CONTAINERS.collector)?.state?.terminated;
        if (collectorEnd && !settled()) return await this.failColdHandOver(spec, key, jobUid, new HandOverError(`the program never reached the run pod: its collector ended first (exit code ${collectorEnd.exitCode}${collectorEnd.exitCode === 3 ? ': its stdin closed before the program came' : ''})`), pod?.metadata?.name ?? '');
        if (status(CONTAINERS.main)?.state?.terminated || collectorEnd) return;
        const usable = !!pod?.metadata?.name && !pod.metadata.deletionTimestamp;
        const running = usable && !!status(CONTAINERS.collector)?.state?.running;
        const bound = usable && !!pod?.spec?.nodeName;
        const now = this.d.clock.now();
        if (ended) {
          if (now - ended.at >= REFUSED_WHILE_RUNNING_MS) return await this.failColdHandOver(spec, key, jobUid, ended.err, ended.pod);
        } else if ((running || bound) && now - lastTry >= EARLY_ATTACH_INTERVAL_MS) {
          lastTry = now;
          try {
            await assertHeld(options, 'handing the program over');
            await this.deliver(key, pod!.metadata!.name!, spec, options, startedAt + spec.startupTimeoutSec * 1000);
            return;
          } catch (err) {
            // Taken over before the hand-over: the Job stays for the new holder (it sees nothing was handed over).
            if (err instanceof FencedError || err instanceof LeftRunningError) return c.untrack(key, err);
            // The run ended meanwhile as this process sees it (given back, taken over, or ended by the
            // controller, which removes its Job itself): a failure now says nothing about it, and the
            // Job, with its pod, is the next holder's to decide on (it fences it if need be).
            if (settled()) return;
            if (err instanceof AttachEndedError) {
              ended = { at: this.d.clock.now(), err, pod: pod!.metadata!.name! };
              continue;
            }
            // Not running yet (the upgrade was refused, no stream opened): try again shortly. Refused
            // while the status says running: the container has just ended (the kubelet reports an
            // end late), and the next status says how; for a moment only, then the attempt fails.
            if (upgradeRefused(err)) {
              if (!running) continue;
              refusedSince ??= now;
              if (this.d.clock.now() - refusedSince < REFUSED_WHILE_RUNNING_MS) continue;
            }
            return await this.failColdHandOver(spec, key, jobUid, err, pod!.metadata!.name!);
          }
        }
        // Until the pod changes, the next attempt is due, or (to notice the run settling) 100 ms.
        const waitMs = bound ? Math.max(1, lastTry + EARLY_ATTACH_INTERVAL_MS - this.d.clock.now()) : 100;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, waitMs);
          wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wake = null;
      }
    } finally {
      off();
    }
  }
}
