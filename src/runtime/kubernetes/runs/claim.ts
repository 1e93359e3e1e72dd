/**
 * What an attach pod's claim says of its program: whether it started there, or never will. The
 * claim is a symlink in the pod's control volume (names.ts `CLAIM_FILE`): deliver.py takes it
 * (`--claim`) before it sends the runner the go line, a run's new holder takes it for `fence`
 * (`FENCE_COMMAND`) before it decides the pod ran nothing; whoever comes second learns who came first.
 * Every path that removes an attach pod as "never reached" (a failed hand-over, an adoption, an
 * earlier attempt's Job) asks here, and each `never` is logged with the reason it rests on, so a run
 * that started over can be traced to the evidence behind it.
 */
import type { Clock } from '../../../clock.ts';
import { upgradeRefused, type KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import { CONTAINERS, FENCE_COMMAND } from '../names.ts';

/** How long the exec that fences a pod may take (an interpreter start in the sandbox), ms. */
const FENCE_TIMEOUT_MS = 15_000;
/** How long a fence whose exec failed is tried again while the pod's collector runs, and how often, ms. */
const FENCE_RETRY_MS = 30_000;
const FENCE_RETRY_INTERVAL_MS = 500;
/**
 * How long a collector must keep looking not started to be believed, ms: the kubelet's status says
 * so and the container runtime refuses the fence's exec for not having it running
 * ({@link runtimeSaysNotRunning}).
 */
const WAITING_BELIEVED_MS = 5000;

/**
 * An exec refused because the container runtime has no such container running: the kubelet's
 * `container not found ("collector")` (not created yet; seen on kcluster, HTTP 500) or the runtime's
 * word that it is created, or ended, but not running. Other refusals (the API server loaded, the
 * kubelet not answering) say nothing about the container.
 */
export function runtimeSaysNotRunning(err: unknown): boolean {
  if (!upgradeRefused(err)) return false;
  for (let e: unknown = err; e instanceof Error; e = e.cause) if (/container (\S+ )?not found|not running|CONTAINER_CREATED|CONTAINER_EXITED/i.test(e.message)) return true;
  return false;
}

/**
 * What a pod's claim says of its program: `started` (deliver.py took the claim: it runs, or ran),
 * `never` (fenced, or its collector ended or is not running, or the pod is gone: no program can start
 * there any more), `unknown` (no answer came: see {@link PodClaims.of}).
 */
export type ClaimAnswer = 'started' | 'never' | 'unknown';

/** What {@link PodClaims} asks with. */
export interface PodClaimsDeps {
  api: KubeApi;
  ns: string;
  clock: Clock;
  log: Logger;
}

/** Asks attach pods' claims (see the module comment). */
export class PodClaims {
  constructor(private readonly d: PodClaimsDeps) {}

  /**
   * Whether a program started in `podName`, or never will, asked of its claim ({@link fence}). The
   * exec can fail without saying either (a starved kubelet or node, a container between states), and
   * taking that for "never" let a program run in two pods: the pod's collector, holding the bytes,
   * took the claim a moment later. So while the API server says the collector runs it is asked again
   * for up to {@link FENCE_RETRY_MS}; a collector not started (nothing could be handed to it; see
   * {@link WAITING_BELIEVED_MS}) or a pod gone says `never`; a collector that ended says by its exit
   * code (3, 4: the program never came) or by its log (the runner's `execution` line). `legacy`: a
   * pod that keeps no claim, asked by its log alone.
   */
  async of(podName: string, executionId: string, legacy = false): Promise<ClaimAnswer> {
    const never = (why: string, tries: number): ClaimAnswer => {
      this.d.log.info({ execution_id: executionId, pod: podName, tries, why }, 'the program never reached this pod');
      return 'never';
    };
    if (!podName) return 'never';
    const until = this.d.clock.now() + FENCE_RETRY_MS;
    let waitingSince: number | null = null;
    for (let tries = 1; ; tries++) {
      const claim = legacy ? null : await this.fence(podName);
      if (claim === 'fenced') return never('fenced: the claim is this process\'s', tries);
      if (claim === 'started') return 'started';
      const pod = await this.d.api.getPod(this.d.ns, podName).catch(() => undefined);
      // A pod being deleted is asked all the same: its collector may take the claim in its grace.
      if (pod === null) return never('the pod is gone', tries);
      const state = pod?.status?.containerStatuses?.find((c) => c.name === CONTAINERS.collector)?.state;
      if (pod && !pod.spec?.nodeName) return never('the pod was never scheduled', tries);
      if (pod && !state?.running && !state?.terminated && (legacy || claim === 'not running')) {
        // Not started, as the kubelet says; it says so late (a status sync after the start), and an
        // early attach reaches the container runtime first. So the runtime must say so too (it
        // refused the fence for it: an exec that failed otherwise, timed out on a starved node, say,
        // may have met a collector that runs and took the program), and both for a while.
        waitingSince ??= this.d.clock.now();
        if (this.d.clock.now() - waitingSince >= WAITING_BELIEVED_MS) return never(`its collector has not started (the kubelet's status and the container runtime, for ${WAITING_BELIEVED_MS} ms)`, tries);
      } else waitingSince = null;
      const code = state?.terminated?.exitCode;
      if (code === 3 || code === 4) return never(`its collector ended with exit code ${code}`, tries);
      if (legacy || state?.terminated) {
        const log = await this.d.api.podLogTail(this.d.ns, podName, CONTAINERS.collector, 200).catch(() => null);
        if (log !== null) return /^execution$/m.test(log) ? 'started' : never('its collector\'s log has no `execution` line', tries);
      }
      if (this.d.clock.now() >= until) {
        this.d.log.warn({ execution_id: executionId, pod: podName, tries }, 'could not learn whether the program started in its pod; following the pod rather than starting it elsewhere');
        return 'unknown';
      }
      await new Promise((r) => setTimeout(r, FENCE_RETRY_INTERVAL_MS));
    }
  }

  /**
   * Takes `podName`'s claim for `fence` (FENCE_COMMAND) unless deliver.py holds it: `fenced`, no
   * program will ever start there; `started`, deliver.py has it (the program runs, or ran); null when
   * the pod could not be asked (the exec failed) or keeps no claim (an older pod); `not running`, the
   * exec was refused for the collector not running ({@link runtimeSaysNotRunning}).
   */
  private async fence(podName: string): Promise<'fenced' | 'started' | 'not running' | null> {
    let refusal: unknown = null;
    const r = await this.d.api.exec(this.d.ns, podName, CONTAINERS.collector, FENCE_COMMAND, { timeoutMs: FENCE_TIMEOUT_MS }).catch((err: unknown) => {
      refusal = err;
      return null;
    });
    if (!r) return runtimeSaysNotRunning(refusal) ? 'not running' : null;
    return r.exitCode === 0 ? 'fenced' : r.exitCode === 17 ? 'started' : null;
  }
}
