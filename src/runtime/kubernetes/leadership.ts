/**
 * Which replica runs the cluster-wide loops (issue 20): the warm pool's creates and removals, and the
 * sweep of orphaned run Jobs. Every replica still serves the API, claims queued runs (SKIP LOCKED)
 * and claims pool pods (a conditional update); only these loops, which act for the whole instance,
 * run on the one replica holding the Lease (src/kube/leader-elector.ts). With leader election off
 * (one replica, or tests) this replica always leads.
 */
import { hostname } from 'node:os';
import type { Clock } from '../../clock.ts';
import type { Config } from '../../config.ts';
import type { KubeApi } from '../../kube/index.ts';
import { kubeLeaseStore, LeaderElector } from '../../kube/index.ts';
import type { Logger } from '../../logger.ts';
import type { LeadershipStatus } from '../runtime.ts';


export interface LeadershipOptions {
  api: KubeApi;
  config: Config;
  clock: Clock;
  log: Logger;
  /** This replica's name: the pod's (POD_NAME, set by the chart) or host and pid. */
  identity?: string;
  /** The orphan sweep: run when this replica starts leading and every `sweepIntervalMs` while it leads. */
  sweep: () => Promise<void>;
  sweepIntervalMs?: number;
  /** Called after this replica starts (true) or stops (false) leading. */
  onChange: (leading: boolean) => void;
}

/** How often the leader sweeps run Jobs whose execution is terminal or gone (replicas that died leave them). */
export const SWEEP_INTERVAL_MS = 60_000;

export class Leadership {
  private readonly elector: LeaderElector | null;
  readonly identity: string;
  private sweepTimer: NodeJS.Timeout | null = null;
  private sweeping: Promise<void> = Promise.resolve();

  constructor(private readonly o: LeadershipOptions) {
    const le = o.config.kubernetes.leader_election;
    this.identity = o.identity ?? process.env.POD_NAME ?? `${hostname()}-${process.pid}`;
    this.elector = le.enabled
      ? new LeaderElector({
          store: kubeLeaseStore(o.api, o.config.kubernetes.namespace, le.lease_name),
          identity: this.identity,
          timing: { leaseDurationMs: le.lease_duration_seconds * 1000, renewDeadlineMs: le.renew_deadline_seconds * 1000, retryPeriodMs: le.retry_period_seconds * 1000 },
          clock: o.clock,
          onChange: (on) => this.changed(on),
          log: o.log,
        })
      : null;
  }

  private changed(on: boolean): void {
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    this.sweepTimer = null;
    if (on) {
      const sweep = () => {
        this.sweeping = this.o.sweep().catch((err: unknown) => this.o.log.warn({ err: String(err) }, 'orphan sweep failed'));
      };
      sweep();
      this.sweepTimer = setInterval(sweep, this.o.sweepIntervalMs ?? SWEEP_INTERVAL_MS);
      this.sweepTimer.unref();
    }
    this.o.onChange(on);
  }

  /**
   * Starts electing; resolves after the first attempt and, when it made this replica the leader, the
   * first sweep: a lone replica has removed the orphans of its last life before it serves.
   */
  async start(): Promise<void> {
    if (this.elector) await this.elector.start();
    else this.changed(true);
    await this.sweeping;
  }

  /** Stops; a leader releases the Lease so another replica takes over within one retry period. */
  async stop(): Promise<void> {
    if (this.elector) await this.elector.stop();
    else this.changed(false);
  }

  get leading(): boolean {
    return this.elector ? this.elector.leading : true;
  }

  status(): LeadershipStatus {
    return {
      enabled: this.elector !== null,
      identity: this.identity,
      leading: this.leading,
      holder: this.elector ? this.elector.holder : this.identity,
      lease: this.elector ? `${this.o.config.kubernetes.namespace}/${this.o.config.kubernetes.leader_election.lease_name}` : null,
    };
  }
}
