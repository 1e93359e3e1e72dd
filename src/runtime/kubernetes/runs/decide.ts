/**
 * The controller's decision, as a pure function of what it knows about one run (its own state, the
 * Job and the Pod from the informer caches, and the time): `decide(run, job, pod, now) → Action[]`.
 * Level-triggered: the same inputs always give the same actions, so a restart, a duplicate event or
 * a missed one changes nothing. The controller only fetches inputs and applies the actions.
 */
import type { V1ContainerStatus, V1Job, V1Pod } from '@kubernetes/client-node';
import { RUNNER_NOT_DELIVERED_EXIT } from '../../run-output.ts';
import type { RunObservation } from '../../runtime.ts';
import { CONTAINERS } from '../names.ts';
import { observedSteps } from './trace-steps.ts';
import type { CollectedOutput } from './output-tar.ts';

/** Result of pulling `/output`: the parsed archive, or why it could not be had. */
export type CollectionOutcome = { ok: true; output: CollectedOutput } | { ok: false; error: string };

/** What the controller remembers about one run it is driving. */
export interface RunState {
  executionId: string;
  jobName: string;
  /** Epoch ms the run began: when we created the Job, or the Job's creation time when adopted. */
  startedAt: number;
  /** Startup limit (sandbox creation, image pull, dependency install), ms. */
  startupTimeoutMs: number;
  /** How long a vanished pod may wait for its Job's status to explain it (deadline vs deletion), ms. */
  podGoneGraceMs: number;
  cancelRequested: boolean;
  /** We deleted the Job ourselves (cancel, startup timeout, image error): its pods vanishing is expected. */
  jobDeleted: boolean;
  /** Last phase reported through `onPhase`. */
  phaseReported: 'startup' | 'execution';
  /** When `main` started (from its container state), remembered in case the pod disappears. */
  mainStartedAt: number | null;
  /** The Job/Pod has been seen at least once (so its absence now means it was removed). */
  jobSeen: boolean;
  podSeen: boolean;
  /** When the pod was first seen gone or deleting without us asking. */
  podGoneAt: number | null;
  collection: CollectionOutcome | null;
  /** The collector has been told to exit. */
  released: boolean;
  /** Tail of the `deps` log once fetched; `undefined` while not fetched. */
  depsLog: string | undefined;
  finished: boolean;
  /** The run claimed a warm pool pod (created before the run), as opposed to a pod made for it. */
  claimed?: boolean;
  /**
   * A run on a claimed pool pod (pool-plan.ts): `main` was running before the run began, so its
   * container state says nothing of the program. The program starts at delivery (the go line sent
   * through attach) and has ended when the runner's `done N` line came back; the run's timeout and
   * its execution time count from delivery.
   */
  warm?: {
    deliveredAt: number | null;
    /** When the hand-over that delivered it began (for the trace's attach span). */
    handOverAt?: number;
    done: { exitCode: number; at: number } | null;
    /** When the next early collect may be tried (one was refused: the collector had not started). */
    earlyCollectAt?: number;
    /** The outputs were pulled by an early collect, before the pod's status showed the collector. */
    collectedEarly?: boolean;
  };
}

/** What the controller should do, in order. */
export type Action =
  | { type: 'enterExecution'; mainStartedAt: number | null }
  | { type: 'collect'; pod: string; early?: boolean }
  | { type: 'release'; pod: string }
  | { type: 'fetchDepsLog'; pod: string }
  | { type: 'deleteJob' }
  | { type: 'notePodGone'; at: number }
  | { type: 'wakeAt'; at: number }
  | { type: 'finish'; observation: RunObservation };

/** How often, and for how long after `done`, the collector's exec is tried before its status shows it running, ms. */
export const EARLY_COLLECT_INTERVAL_MS = 40;
export const EARLY_COLLECT_WINDOW_MS = 2000;

/** Waiting reasons that mean the image can never be pulled or used: fail at once (`docker_error`). */
export const IMAGE_ERRORS = new Set(['ErrImagePull', 'ImagePullBackOff', 'InvalidImageName', 'ErrImageNeverPull']);
/** Terminated reasons that mean the container's command could not start. */
export const START_ERRORS = new Set(['ContainerCannotRun', 'StartError']);

/** Epoch ms of a timestamp that may be a Date (typed list) or an RFC 3339 string (raw watch event). */
export function toMs(t: Date | string | undefined | null): number | null {
  if (t === undefined || t === null) return null;
  const n = t instanceof Date ? t.getTime() : Date.parse(t);
  return Number.isFinite(n) ? n : null;
}

function status(pod: V1Pod | undefined, name: string, init = false): V1ContainerStatus | undefined {
  const list = init ? pod?.status?.initContainerStatuses : pod?.status?.containerStatuses;
  return list?.find((c) => c.name === name);
}

/**
 * Whether the program ran out of memory: `main` was OOM-killed, or it exited 137 (SIGKILL) while the
 * pod shows its memory exhausted. Under gVisor the pod is one sandbox and the kill can land on the
 * sandbox itself: `main` may then say only `Error`/137, while another container says `OOMKilled`, or
 * the collector, not started yet, fails with `StartError`/`ContainerCannotRun` (the sandbox it would
 * start in is gone). A 137 with the collector running or stopped normally (a pod deletion: the runner
 * kills the program and exits 137, the collector exits 0) is not taken as memory.
 */
export function mainOomKilled(pod: V1Pod | undefined): boolean {
  const term = status(pod, CONTAINERS.main)?.state?.terminated;
  if (!term) return false;
  if (term.reason === 'OOMKilled') return true;
  if (term.exitCode !== 137) return false;
  const others = [...(pod?.status?.initContainerStatuses ?? []), ...(pod?.status?.containerStatuses ?? [])].filter((c) => c.name !== CONTAINERS.main);
  if (others.some((c) => c.state?.terminated?.reason === 'OOMKilled')) return true;
  const collectorEnd = status(pod, CONTAINERS.collector)?.state?.terminated?.reason;
  return collectorEnd !== undefined && START_ERRORS.has(collectorEnd);
}

function jobDeadlineExceeded(job: V1Job | undefined): boolean {
  return !!job?.status?.conditions?.some((c) => c.type === 'Failed' && c.status === 'True' && c.reason === 'DeadlineExceeded');
}

/**
 * What the runtime itself saw, from the pod's container states (second precision, as Kubernetes
 * records them) and the run's own start time (ms).
 */
export function observe(run: RunState, pod: V1Pod | undefined, now: number, over: Partial<RunObservation> = {}): RunObservation {
  const main = status(pod, CONTAINERS.main);
  const deps = status(pod, CONTAINERS.deps, true);
  const term = main?.state?.terminated;
  const warm = run.warm;
  const mainStarted = warm ? warm.deliveredAt : (toMs(main?.state?.running?.startedAt ?? term?.startedAt) ?? run.mainStartedAt);
  const mainFinished = warm?.done ? warm.done.at : toMs(term?.finishedAt);
  const startedAt = run.startedAt;
  const endedAt = Math.max(startedAt, mainFinished ?? now);
  const depsStart = toMs(deps?.state?.terminated?.startedAt ?? deps?.state?.running?.startedAt);
  const depsEnd = toMs(deps?.state?.terminated?.finishedAt) ?? (deps?.state?.running ? now : null);
  const ended = !!term || !!warm?.done;
  const exitCode = warm?.done ? warm.done.exitCode : term ? (term.exitCode ?? null) : null;
  const phase: RunObservation['phase'] = ended ? (exitCode === 0 ? 'completed' : 'failed') : mainStarted !== null ? 'execution' : 'startup';
  return {
    exitCode,
    timedOut: null,
    oomKilled: mainOomKilled(pod),
    cancelled: false,
    dependencyError: null,
    infraError: null,
    phase,
    startedAt: new Date(startedAt),
    endedAt: new Date(endedAt),
    startupMs: mainStarted !== null ? Math.max(0, mainStarted - startedAt) : endedAt - startedAt,
    depInstallMs: depsStart !== null && depsEnd !== null ? Math.max(0, depsEnd - depsStart) : 0,
    executionMs: mainStarted !== null ? Math.max(0, (mainFinished ?? now) - mainStarted) : 0,
    totalMs: endedAt - startedAt,
    warm: run.claimed === true,
    steps: observedSteps(run, pod),
    ...over,
  };
}

/** See the module comment. `pod` is the run's pod (the first one seen), `undefined` when absent. */
export function decide(run: RunState, job: V1Job | undefined, pod: V1Pod | undefined, now: number): Action[] {
  if (run.finished) return [];
  const finish = (over: Partial<RunObservation> = {}): Action => ({ type: 'finish', observation: observe(run, pod, now, over) });
  const podName = pod?.metadata?.name ?? '';
  const main = status(pod, CONTAINERS.main);
  const collector = status(pod, CONTAINERS.collector);
  const deps = status(pod, CONTAINERS.deps, true);
  const warm = run.warm;
  const mainStartedAtMs = warm ? warm.deliveredAt : toMs(main?.state?.running?.startedAt ?? main?.state?.terminated?.startedAt);
  const mainStarted = (warm ? warm.deliveredAt !== null : !!(main?.state?.running || main?.state?.terminated)) || run.phaseReported === 'execution';
  // A warm run's program has ended when the runner said `done` (its report is written by then); a
  // 137 waits for the container's own status, which tells an OOM kill from other SIGKILLs.
  const mainTerm = main?.state?.terminated ?? (warm?.done && warm.done.exitCode !== 137 ? { exitCode: warm.done.exitCode } : undefined);

  // Cancellation wins over everything: stop the pod, report at once.
  if (run.cancelRequested) {
    return [...(run.jobDeleted ? [] : [{ type: 'deleteJob' } as const]), finish({ cancelled: true })];
  }

  // Outputs pulled: let the collector go, then report.
  if (run.collection) {
    if (!run.released && pod && (collector?.state?.running || warm?.collectedEarly) && !pod.metadata?.deletionTimestamp) return [{ type: 'release', pod: podName }];
    if (run.collection.ok) return [finish()];
    return [finish(mainOomKilled(pod) ? {} : { infraError: { type: 'internal_error', message: `outputs could not be collected: ${run.collection.error}` } })];
  }

  const enter: Action[] = mainStarted && run.phaseReported === 'startup' ? [{ type: 'enterExecution', mainStartedAt: mainStartedAtMs }] : [];

  // The program ran out of memory: that is the run's outcome, whatever happened to the collector.
  // With the collector up, its outputs are pulled as usual (below); when it never started (the
  // sandbox died with the program), was killed, or the pod or Job is ending, they are lost: oom
  // without them, never docker_error or internal_error. A collector still being created is waited for.
  // Once the Job's deadline has fired its pod is being torn down: a collector still shown running is
  // not waited for either (the Job's status can reach us before the pod's deletion does).
  if (mainOomKilled(pod)) {
    const collectorUp = !!collector?.state?.running && !pod?.metadata?.deletionTimestamp && !jobDeadlineExceeded(job);
    const phase = pod?.status?.phase;
    const noCollector = !!collector?.state?.terminated || phase === 'Failed' || phase === 'Succeeded' || !!pod?.metadata?.deletionTimestamp || jobDeadlineExceeded(job);
    if (!collectorUp && noCollector) return [...enter, finish()];
  }

  // The Job's activeDeadlineSeconds fired (the backstop behind the runner's own timeout).
  if (jobDeadlineExceeded(job)) return [finish({ timedOut: mainStarted ? 'execution' : 'startup' })];

  // Evicted (node pressure, ephemeral storage over its limit): the machinery failed the run.
  if (pod?.status?.reason === 'Evicted') {
    return [finish({ infraError: { type: 'internal_error', message: `pod evicted: ${pod.status.message ?? 'no message'}` } })];
  }

  // Pod deleted (or deleting) under the run without us asking. The Job controller deletes pods
  // before it records DeadlineExceeded, so give the Job's status a moment to explain the loss.
  const podGone = (!pod && run.podSeen) || !!pod?.metadata?.deletionTimestamp;
  if (podGone && !run.jobDeleted) {
    if (run.podGoneAt === null) return [{ type: 'notePodGone', at: now }, { type: 'wakeAt', at: now + run.podGoneGraceMs }];
    if (now < run.podGoneAt + run.podGoneGraceMs) return [{ type: 'wakeAt', at: run.podGoneAt + run.podGoneGraceMs }];
    return [finish({ infraError: { type: 'internal_error', message: 'the run pod was deleted while the run was in progress' } })];
  }
  if (!job && run.jobSeen && !run.jobDeleted) {
    return [finish({ infraError: { type: 'internal_error', message: 'the run Job was deleted while the run was in progress' } })];
  }

  // Image problems never heal by waiting: report docker_error now, not at the startup timeout.
  for (const c of [deps, main, collector]) {
    const w = c?.state?.waiting;
    if (w?.reason && IMAGE_ERRORS.has(w.reason)) {
      return [{ type: 'deleteJob' }, finish({ infraError: { type: 'docker_error', message: `${c?.name}: ${w.reason}: ${w.message ?? ''}`.trim() } })];
    }
    const t = c?.state?.terminated;
    if (t?.reason && START_ERRORS.has(t.reason)) {
      // A sandbox that died under a running program fails the containers it had not started yet,
      // and main's own status can trail theirs: give it a moment to show an OOM kill first
      // (finishedAt has whole seconds, hence the extra second).
      const failedAt = toMs(t.finishedAt);
      const waitUntil = failedAt === null ? null : failedAt + 1000 + run.podGoneGraceMs;
      if (c !== main && main?.state?.running && waitUntil !== null && now < waitUntil) {
        return [...enter, { type: 'wakeAt', at: waitUntil }];
      }
      return [{ type: 'deleteJob' }, finish({ infraError: { type: 'docker_error', message: `${c?.name}: ${t.reason}: ${t.message ?? ''}`.trim() } })];
    }
  }

  // Dependency installation failed: report pip's own words (the log tail).
  const depsTerm = deps?.state?.terminated;
  if (depsTerm && depsTerm.exitCode !== 0) {
    if (depsTerm.reason === 'OOMKilled') return [finish({ oomKilled: true, phase: 'startup' })];
    if (run.depsLog === undefined) return [{ type: 'fetchDepsLog', pod: podName }];
    return [finish({ dependencyError: run.depsLog.trim() || `dependency installation failed (exit code ${depsTerm.exitCode})` })];
  }

  // A runner whose go connection closed before the go line ran nothing (its collector died mid
  // hand-over): an infrastructure failure, never the program's success. No `done` came, which a
  // program of our own that exited 123 would have sent first. The service retries the attempt.
  if (warm && !warm.done && main?.state?.terminated?.exitCode === RUNNER_NOT_DELIVERED_EXIT) {
    return [
      ...(run.jobDeleted ? [] : [{ type: 'deleteJob' } as const]),
      finish({ infraError: { type: 'internal_error', message: 'the program never reached the run pod: the go connection of its runner closed before the go line' } }),
    ];
  }

  if (mainTerm) {
    if (collector?.state?.running) return [...enter, { type: 'collect', pod: podName }];
    if (collector?.state?.terminated || pod?.status?.phase === 'Failed' || pod?.status?.phase === 'Succeeded') {
      return [...enter, finish(mainOomKilled(pod) ? {} : { infraError: { type: 'internal_error', message: 'outputs lost: the collector container is gone' } })];
    }
    // The runner said `done`, so the pod's containers were started; its collector, started right
    // after `main`, is most likely up, but the kubelet reports that only at its next status sync (up
    // to a second later). Its exec is tried meanwhile (a refused upgrade opens no stream), for a while.
    if (warm?.done && pod?.spec?.nodeName && !pod.metadata?.deletionTimestamp && now < warm.done.at + EARLY_COLLECT_WINDOW_MS) {
      const at = warm.earlyCollectAt ?? now;
      return at <= now ? [...enter, { type: 'collect', pod: podName, early: true }] : [...enter, { type: 'wakeAt', at }];
    }
    // The collector has not started yet (slow image pull): wait for it; the Job deadline bounds this.
    return enter;
  }
  if (mainStarted) return enter;

  // Not started yet: unschedulable, pulling, installing. Bounded by the startup timeout.
  const deadline = run.startedAt + run.startupTimeoutMs;
  if (now >= deadline) return [{ type: 'deleteJob' }, finish({ timedOut: 'startup' })];
  return [{ type: 'wakeAt', at: deadline }];
}

/** A fresh state for a run that starts (or is adopted) now. */
export function newRunState(init: Pick<RunState, 'executionId' | 'jobName' | 'startedAt' | 'startupTimeoutMs' | 'podGoneGraceMs'> & Partial<RunState>): RunState {
  return {
    cancelRequested: false,
    jobDeleted: false,
    phaseReported: 'startup',
    mainStartedAt: null,
    jobSeen: false,
    podSeen: false,
    podGoneAt: null,
    collection: null,
    released: false,
    depsLog: undefined,
    finished: false,
    ...init,
  };
}

/** How a run goes on after a hand-over that failed before its program started (runs/hand-over.ts). */
export type HandOverNext = 'warm' | 'cold' | 'fail';

/**
 * The next try after a failed hand-over, a pure function of the path that failed and how many hand-
 * overs of this run failed so far (this one included). Nothing of the program ran, so trying again
 * cannot run it twice. A warm hand-over is retried on another pool pod once (a miss there starts cold),
 * then cold; a cold attach pod's failure fails the attempt, which the service's retry runs again (its
 * Job has the execution's own name and must go first). `maxWarmRetries`: pool pods tried after the first.
 */
export function afterHandOverFailure(path: 'warm' | 'cold-attach', failures: number, maxWarmRetries = 1): HandOverNext {
  if (path === 'cold-attach') return 'fail';
  return failures <= maxWarmRetries ? 'warm' : 'cold';
}
