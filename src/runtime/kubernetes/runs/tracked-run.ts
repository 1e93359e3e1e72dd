/** What the run controller (controller.ts) keeps of one run, and whose objects are the run's. */
import type { V1Pod } from '@kubernetes/client-node';
import type { LogFollowHandle } from '../../../kube/index.ts';
import type { RawRun } from '../../runtime.ts';
import type { RunState } from './decide.ts';
import type { OutputLimits } from './output-tar.ts';

/** One run the controller drives until it resolves. */
export interface TrackedRun {
  state: RunState;
  limits: OutputLimits;
  onPhase?: (phase: 'startup' | 'installing' | 'execution') => void;
  /** The program's output as it runs: the `main` container's log, followed from the moment it started. */
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Uint8Array) => void;
  /** The follow of the `main` container's log, once started. */
  logFollow?: LogFollowHandle;
  /** `installing` was reported (the `deps` init container ran). */
  installingReported?: boolean;
  resolve: (raw: RawRun) => void;
  reject: (err: unknown) => void;
  collectFailures: number;
  /** Collection attempts that failed because the API server did not take them. */
  collectUnavailable?: number;
  podUid?: string;
  /**
   * The uid of the run's own Job, once the runtime has it (create answer, 409 read, adoption). Until
   * then nothing is taken as the run's: a Job of the same name from an earlier attempt, and its pod,
   * can still be there, terminating.
   */
  jobUid?: string;
  /** Deletions heard before `jobUid` was known: Job uids, and pod uids with their owners' uids. */
  deletedJobs?: Set<string>;
  deletedPods?: { uid: string; owners: string[] }[];
  /** The outputs its collector sends on the attach: true once they are the run's collection. */
  relayed?: Promise<boolean>;
  /** Called when the runner's `done` comes (a collect waiting for it goes on). */
  doneHeard?: () => void;
  /** A warm or attach run's attach to its `collector` (closed when the run ends, or once a held release went on it). */
  attach?: { close(): void; send?(data: string): Promise<void> };
  /**
   * RunOptions.holdRelease: the collector is let go only when the caller says the record is written
   * (RawRun.letGo), not once the outputs are in. `pendingRelease`: how it will be, then (the line
   * `release` on the attach the outputs came by, or the release file by exec) and in which pod.
   */
  holdRelease?: boolean;
  pendingRelease?: { via: 'attach' | 'exec'; pod?: string };
}

/** The uids of a pod's owners: its ownerReferences and the Job controller's `controller-uid` labels. */
export function ownerUids(o: V1Pod): string[] {
  const labels = o.metadata?.labels ?? {};
  return [
    ...(o.metadata?.ownerReferences ?? []).map((r) => r.uid),
    ...[labels['controller-uid'], labels['batch.kubernetes.io/controller-uid']].filter((v): v is string => !!v),
  ];
}

