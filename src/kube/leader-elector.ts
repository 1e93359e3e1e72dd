/**
 * Runs leader election over a Lease (decisions in lease-decide.ts): reads the Lease every retry
 * period, renews or takes it when the decision says so, and tells its listeners when this replica
 * starts or stops leading. On `stop()` a leader releases the Lease (empty holder), so another replica
 * takes over within one retry period instead of a whole lease duration.
 *
 * A leader that cannot renew (API unreachable, a write lost to another replica) keeps leading only
 * until its renew deadline, and stops *before* any other replica may take the Lease: with
 * renewDeadline < leaseDuration, two replicas never both believe they lead.
 */
import { V1MicroTime, type V1Lease } from '@kubernetes/client-node';
import type { Clock } from '../clock.ts';
import { changedSince, checkTiming, decideLease, mustStepDown, releasedRecord, type ElectionTiming, type LeaseRecord, type Observed } from './lease-decide.ts';

/** Where the Lease lives: the API server (kubeLeaseStore) or anything with the same answers. */
export interface LeaseStore {
  get(): Promise<LeaseRecord | null>;
  /** `null` when it exists already (another replica created it first). */
  create(r: LeaseRecord): Promise<LeaseRecord | null>;
  /** `null` when it changed since `r.resourceVersion` was read. */
  replace(r: LeaseRecord): Promise<LeaseRecord | null>;
}

/** The calls a Lease store makes (KubeApi has them). */
export interface LeaseApi {
  getLease(namespace: string, name: string): Promise<V1Lease | null>;
  createLease(lease: V1Lease): Promise<V1Lease | null>;
  replaceLease(lease: V1Lease): Promise<V1Lease | null>;
}

function toRecord(l: V1Lease): LeaseRecord {
  const ms = (d: Date | undefined) => (d ? new Date(d).getTime() : 0);
  return {
    holder: l.spec?.holderIdentity ?? '',
    leaseDurationSec: l.spec?.leaseDurationSeconds ?? 0,
    acquireMs: ms(l.spec?.acquireTime),
    renewMs: ms(l.spec?.renewTime),
    transitions: l.spec?.leaseTransitions ?? 0,
    resourceVersion: l.metadata?.resourceVersion ?? '',
  };
}

function toLease(namespace: string, name: string, r: LeaseRecord): V1Lease {
  return {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { namespace, name, ...(r.resourceVersion ? { resourceVersion: r.resourceVersion } : {}), labels: { 'app.kubernetes.io/managed-by': 'sandpod' } },
    spec: {
      holderIdentity: r.holder,
      leaseDurationSeconds: r.leaseDurationSec,
      // MicroTime: the API server parses these with microseconds only.
      acquireTime: new V1MicroTime(r.acquireMs),
      renewTime: new V1MicroTime(r.renewMs),
      leaseTransitions: r.transitions,
    },
  };
}

/** The Lease `namespace/name` through the Kubernetes API. */
export function kubeLeaseStore(api: LeaseApi, namespace: string, name: string): LeaseStore {
  const rec = (l: V1Lease | null) => (l ? toRecord(l) : null);
  return {
    get: async () => rec(await api.getLease(namespace, name)),
    create: async (r) => rec(await api.createLease(toLease(namespace, name, r))),
    replace: async (r) => rec(await api.replaceLease(toLease(namespace, name, r))),
  };
}

export interface LeaderElectorOptions {
  store: LeaseStore;
  identity: string;
  timing: ElectionTiming;
  clock: Clock;
  /** Called with `true` when this replica starts leading, `false` when it stops. */
  onChange?: (leading: boolean) => void;
  log?: { info(o: object, msg: string): void; warn(o: object, msg: string): void };
}

export class LeaderElector {
  private leadingNow = false;
  private holderNow = '';
  private observed: Observed | null = null;
  private lastRenewMs = 0;
  private timer: NodeJS.Timeout | null = null;
  private running = false;
  private ticking: Promise<void> | null = null;

  constructor(private readonly o: LeaderElectorOptions) {
    checkTiming(o.timing);
  }

  get identity(): string {
    return this.o.identity;
  }
  /** Whether this replica leads now. */
  get leading(): boolean {
    return this.leadingNow;
  }
  /** The holder as last seen ('' when unknown or released). */
  get holder(): string {
    return this.holderNow;
  }

  private setLeading(on: boolean): void {
    if (on === this.leadingNow) return;
    this.leadingNow = on;
    this.o.log?.info({ identity: this.o.identity, leading: on }, on ? 'leader election: leading' : 'leader election: stopped leading');
    this.o.onChange?.(on);
  }

  /** One attempt: read, decide, write. Exposed for tests, which drive the clock by hand. */
  async tick(): Promise<void> {
    const now = this.o.clock.now();
    if (this.leadingNow && mustStepDown(now, this.lastRenewMs, this.o.timing)) this.setLeading(false);
    let current: LeaseRecord | null;
    try {
      current = await this.o.store.get();
    } catch (err) {
      this.o.log?.warn({ err: String(err) }, 'leader election: could not read the Lease');
      return;
    }
    const step = decideLease(now, this.o.identity, current, this.observed, this.o.timing);
    if (step.kind === 'follow') {
      this.observed = { record: current!, changedAtMs: changedSince(now, current!, this.observed) };
      this.holderNow = step.holder;
      this.setLeading(false);
      return;
    }
    let written: LeaseRecord | null = null;
    try {
      written = step.kind === 'create' ? await this.o.store.create(step.record) : await this.o.store.replace(step.record);
    } catch (err) {
      this.o.log?.warn({ err: String(err), step: step.kind }, 'leader election: could not write the Lease');
      return;
    }
    if (written === null) return; // another replica wrote first: read again next time
    this.observed = { record: written, changedAtMs: now };
    this.holderNow = this.o.identity;
    this.lastRenewMs = now;
    this.setLeading(true);
  }

  /** Starts the loop; resolves when the first attempt (made at once) is done. */
  start(): Promise<void> {
    if (this.running) return Promise.resolve();
    this.running = true;
    const loop = () => {
      if (!this.running) return;
      this.ticking = this.tick().finally(() => {
        this.ticking = null;
        if (this.running) this.timer = setTimeout(loop, this.o.timing.retryPeriodMs);
      });
    };
    loop();
    return this.ticking ?? Promise.resolve();
  }

  /** Stops the loop; a leader releases the Lease so another replica takes over at once. */
  async stop(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.ticking;
    if (!this.leadingNow) return;
    this.setLeading(false);
    try {
      // What this replica last wrote is the Lease as it stands unless someone took it since: release
      // at that resourceVersion at once (one call, not a read and a write, on an API server that may be
      // slow while the node is busy); only a conflict makes it read what is there.
      const mine = this.observed?.record;
      if (mine && mine.holder === this.o.identity && (await this.o.store.replace(releasedRecord(mine, this.o.clock.now())))) return;
      const current = await this.o.store.get();
      if (current && current.holder === this.o.identity) await this.o.store.replace(releasedRecord(current, this.o.clock.now()));
    } catch (err) {
      this.o.log?.warn({ err: String(err) }, 'leader election: could not release the Lease (it expires instead)');
    }
  }
}
