/**
 * Letting a run pod's collector go once its outputs are in: it exits and the pod completes. Then the
 * outputs exist only in the process that took them. Released before that process wrote the run's
 * record, a process that dies in between (a replica killed mid-burst) leaves a pod whose outputs are
 * gone, and the replica that adopts the run can only fail it ("outputs lost"). So with
 * `RunOptions.holdRelease` the release waits for the caller's `RawRun.letGo` (the record is written);
 * until then an adopter finds the collector up and pulls the outputs itself.
 */
import type { KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import { CONTAINERS, RELEASE_COMMAND } from '../names.ts';
import type { TrackedRun } from './tracked-run.ts';

/** What a release needs. */
export interface ReleaseDeps {
  api: KubeApi;
  namespace: string;
  execTimeoutMs?: number;
  log: Logger;
}

/** Writes the collector's release file by exec, in the background (a collector we cannot reach ends with the Job's deadline). */
export function releaseByExec(d: ReleaseDeps, executionId: string, pod: string): void {
  void d.api.exec(d.namespace, pod, CONTAINERS.collector, RELEASE_COMMAND, { timeoutMs: d.execTimeoutMs ?? 30_000 }).catch((err: unknown) => {
    d.log.warn({ execution_id: executionId, err: String(err) }, 'could not release the collector');
  });
}

/**
 * A held run's release (RawRun.letGo): the line `release` on the attach its outputs came by (deliver.py
 * exits on it), or the release file by exec when there is no attach or the line could not be sent.
 * Once only; the attach is closed after.
 */
export function releaseHeld(d: ReleaseDeps, run: TrackedRun): void {
  const held = run.pendingRelease;
  run.pendingRelease = undefined;
  const attach = run.attach;
  run.attach = undefined;
  if (!held) {
    attach?.close();
    return;
  }
  const byExec = () => {
    if (held.pod) releaseByExec(d, run.state.executionId, held.pod);
  };
  if (held.via === 'attach' && attach?.send) {
    attach.send('release\n').then(
      () => attach.close(),
      () => {
        attach.close();
        byExec();
      },
    );
    return;
  }
  attach?.close();
  byExec();
}
