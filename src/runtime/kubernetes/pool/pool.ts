/**
 * The cluster warm pool (issue 10): per JobType a number of pool Jobs (pool-plan.ts) whose pods wait
 * for their program. The pool is whatever the Job informer shows with this instance's labels and a
 * pool label: a restarted service finds (adopts) its idle pods there, and removes those whose spec
 * changed. Reconciled on a timer and after informer events, one pass at a time; the decisions are
 * `planPool` / `claimOrder`.
 *
 * A claim is a patch of the pool Job whose precondition is the resourceVersion it was read at: when
 * another replica claimed it first the API server answers 409 and the next candidate is tried, so a
 * pod is never handed to two runs (two runs of this replica race the same way). The claimed Job
 * leaves the pool for good (it has an execution id); it runs one program and ends like any run Job.
 * Its refill waits while that run goes on, a little (planPool's `refillDelayMs`), unless the pool
 * has no ready pod left.
 */
import { randomBytes } from 'node:crypto';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import type { RunSpec, WarmPoolStats } from '../../runtime.ts';
import { UnretryableError } from '../../../errors.ts';
import type { RunController } from '../runs/controller.ts';
import { poolable, claimJobPatch, claimPodPatch, poolJob } from './pool-plan.ts';
import { claimOrder, memberOf, planPool, poolBackoffMs, type PoolMember, type PoolWant } from './pool-decide.ts';
import { ReconcileLoop } from '../reconcile-loop.ts';
import type { RunnerSources } from '../runs/runner-sources.ts';

/**
 * How long a claimed pool pod's refill may wait for its run to end, ms (planPool's `refillDelayMs`):
 * long enough for a short run to finish before a new pod boots beside it, short enough that a long
 * run's replacement is not late for the next claims.
 */
export const REFILL_DELAY_MS = 3000;

/** Options of {@link WarmPool}. */
export interface WarmPoolOptions {
  api: KubeApi;
  controller: RunController;
  config: Config;
  clock: Clock;
  log: Logger;
  /** The JobTypes there are now (the registry's list). */
  jobTypes: () => JobType[];
  /** The RuntimeClass runs get (null: none; false: none may run). */
  runtimeClassName: () => Promise<string | null | false>;
  /** The runner and deliver.py: pool pods mount them from their ConfigMap, made sure of before each create. */
  sources: RunnerSources;
  /** Whether this replica creates and removes pool Jobs (the leader's job); default: always. */
  leading?: () => boolean;
  /** How often the pool is reconciled without an event, ms. */
  intervalMs?: number;
  /** Pool Jobs created at once per JobType. */
  maxStarting?: number;
  /** See {@link REFILL_DELAY_MS}. */
  refillDelayMs?: number;
}

/** A claimed pool pod. */
export interface Claim<E = never> {
  job: V1Job;
  pod: V1Pod;
  /** Settles once the pod carries the run's labels (rejects when it could not be labelled). */
  labelled: Promise<void>;
  /** What `early` began for this pod while its claim was decided. */
  early?: E;
}

/** Begun for a candidate pod while its claim is decided (an attach); abandoned when the claim is not won. */
export interface EarlyStart {
  abandon(): void;
}

/** See the module comment. */
export class WarmPool {
  private readonly counts = new Map<string, { hits: number; misses: number; handOverRetries: number }>();
  /** Spec hash per JobType name, from the last pass (claims only take pods of the current spec). */
  private hashes = new Map<string, string>();
  /**
   * Pool Jobs a claim of this replica is patching, or won while the cache does not show it yet: other
   * runs here skip them instead of racing for them (a lost race would cost a 409 and an attach).
   */
  private readonly claiming = new Set<string>();
  /** Claimed Jobs whose run this replica saw end: their refill need not wait. */
  private readonly over = new Set<string>();
  /** Pool pods of a JobType that failed in a row (reset when one is ready), and when the last did. */
  private readonly failures = new Map<string, { count: number; lastAt: number; seen: Set<string> }>();

  private readonly loop: ReconcileLoop;

  constructor(private readonly o: WarmPoolOptions) {
    this.loop = new ReconcileLoop(() => this.reconcile(), { what: 'warm pool', log: o.log, intervalMs: o.intervalMs });
  }

  /** The size wanted for a JobType. */
  sizeOf(jt: JobType): number {
    return jt.warmPoolSize ?? this.o.config.kubernetes.warm_pool_size;
  }

  private get maxIdleMs(): number {
    return this.o.config.kubernetes.warm_pool_max_idle_seconds * 1000;
  }

  start(): void {
    this.loop.start([(cb) => this.o.controller.jobs.on(cb), (cb) => this.o.controller.pods.on(cb)]);
  }

  stop(): void {
    this.loop.stop();
  }

  /** Runs a reconcile pass now, or right after the one in progress. Resolves when it is done. */
  kick(): Promise<void> {
    return this.loop.kick();
  }

  private get stopped(): boolean {
    return this.loop.stopped;
  }

  /** Jobs this pool created that the informer has not shown yet (counted as starting). */
  private readonly pending = new Map<string, { jobType: string; specHash: string; at: number }>();

  private members(): PoolMember[] {
    const pods = new Map<string, V1Pod>();
    for (const p of this.o.controller.pods.list()) {
      const jobName = p.metadata?.labels?.['job-name'];
      if (jobName) pods.set(jobName, p);
    }
    const out: PoolMember[] = [];
    const names = new Set<string>();
    for (const j of this.o.controller.jobs.list()) {
      const m = memberOf(j, pods.get(j.metadata?.name ?? ''));
      if (!m) continue;
      names.add(m.name);
      if (this.over.has(m.name)) delete m.claimedAt;
      out.push(m);
    }
    for (const n of this.over) if (!names.has(n)) this.over.delete(n);
    // A won claim is skipped until the cache shows it claimed (or gone).
    for (const n of this.claiming) {
      const j = this.o.controller.jobs.get(n);
      if (!j || memberOf(j, undefined)?.claimed) this.claiming.delete(n);
    }
    const now = this.o.clock.now();
    for (const [name, p] of this.pending) {
      if (this.o.controller.jobs.get(name) || now - p.at > 30_000) this.pending.delete(name);
      else out.push({ name, jobType: p.jobType, specHash: p.specHash, createdAt: p.at, ready: false, claimed: false, deleting: false, failed: false });
    }
    return out;
  }

  /**
   * Counts pool pods that failed unclaimed (each once), resets a JobType's count once one of its pods
   * is ready, and returns until when each JobType's pool is held (planPool's `holdUntil`).
   */
  private noteFailures(members: readonly PoolMember[], now: number): Map<string, number> {
    for (const m of members) {
      if (m.claimed || m.deleting) continue;
      if (m.ready) {
        this.failures.delete(m.jobType);
        continue;
      }
      if (!m.failed) continue;
      const f = this.failures.get(m.jobType) ?? { count: 0, lastAt: now, seen: new Set<string>() };
      if (f.seen.has(m.name)) continue;
      f.seen.add(m.name);
      f.count++;
      f.lastAt = now;
      this.failures.set(m.jobType, f);
      this.o.log.warn({ job: m.name, job_type: m.jobType, failures: f.count, retry_in_ms: poolBackoffMs(f.count), why: m.failedWhy }, 'a warm pool pod failed');
    }
    const names = new Set(members.map((m) => m.name));
    for (const f of this.failures.values()) for (const n of f.seen) if (!names.has(n)) f.seen.delete(n);
    return new Map([...this.failures].map(([jt, f]) => [jt, f.lastAt + poolBackoffMs(f.count)]));
  }

  /** The pool Job of a JobType now (with a fresh name), or null when runs cannot be made. */
  private async template(jt: JobType, name: string): Promise<{ job: V1Job; specHash: string } | null> {
    const rc = await this.o.runtimeClassName();
    return rc === false ? null : this.poolJobOf(jt, name, rc);
  }

  private poolJobOf(jt: JobType, name: string, rc: string | null): { job: V1Job; specHash: string } {
    return poolJob(jt, this.o.config, { runtimeClassName: rc, sources: this.o.sources.name(), name, maxIdleSec: this.o.config.kubernetes.warm_pool_max_idle_seconds });
  }

  /** Spec hashes per JobType object, with what else they were made from (a few ms of CPU each to make). */
  private readonly hashCache = new WeakMap<JobType, { rc: string | null; sources: string; specHash: string }>();

  /** The spec hash of a JobType's pool pods now, or null when runs cannot be made (see {@link template}). */
  private async specHash(jt: JobType): Promise<string | null> {
    const rc = await this.o.runtimeClassName();
    if (rc === false) return null;
    const sources = this.o.sources.name();
    const hit = this.hashCache.get(jt);
    if (hit && hit.rc === rc && hit.sources === sources) return hit.specHash;
    // Made from the RuntimeClass just read (a second lookup could answer otherwise, and the entry would lie).
    const { specHash } = this.poolJobOf(jt, 'x', rc);
    this.hashCache.set(jt, { rc, sources, specHash });
    return specHash;
  }

  private async reconcile(): Promise<void> {
    if (!this.o.controller.jobs.synced || !this.o.controller.pods.synced) return;
    const wants: PoolWant[] = [];
    const hashes = new Map<string, string>();
    for (const jt of this.o.jobTypes()) {
      // Runs with requirements to install at run time never come from the pool (it has no `deps`).
      const size = poolable(jt) ? this.sizeOf(jt) : 0;
      const specHash = size > 0 ? await this.specHash(jt) : null;
      if (!specHash) continue;
      hashes.set(jt.name, specHash);
      wants.push({ jobType: jt.name, size, specHash });
    }
    this.hashes = hashes;
    // Creates and removals are the leader's (issue 20): with several replicas a pool never exceeds
    // its size. Every replica still knows the templates above, so every replica can claim.
    if (this.o.leading && !this.o.leading()) return;
    const members = this.members();
    const now = this.o.clock.now();
    const holdUntil = this.noteFailures(members, now);
    const plan = planPool(wants, members, now, { maxIdleMs: this.maxIdleMs, maxStarting: this.o.maxStarting ?? 4, holdUntil, refillDelayMs: this.o.refillDelayMs ?? REFILL_DELAY_MS });
    const ns = this.o.config.kubernetes.runs_namespace;
    for (const r of plan.remove) {
      // Only as we saw it: a Job another replica claimed since is a run now, not ours to remove.
      const rv = this.o.controller.jobs.get(r.name)?.metadata?.resourceVersion;
      if (!rv) continue;
      this.o.log.info({ job: r.name, reason: r.reason }, 'removing warm pool Job');
      await this.o.api.deleteJobIfUnchanged(ns, r.name, rv);
    }
    const byName = new Map(this.o.jobTypes().map((jt) => [jt.name, jt]));
    for (const c of plan.create) {
      const jt = byName.get(c.jobType);
      if (!jt) continue;
      for (let i = 0; i < c.count; i++) {
        // A pass outlives its leadership when the API is slow: a replica that stopped leading makes no more.
        if (this.o.leading && !this.o.leading()) return;
        const t = await this.template(jt, `sp-w-${randomBytes(6).toString('hex')}`);
        if (!t) continue;
        await this.o.sources.ensure();
        const name = t.job.metadata!.name!;
        this.pending.set(name, { jobType: jt.name, specHash: t.specHash, at: this.o.clock.now() });
        await this.o.api.createJob(t.job).catch((err: unknown) => {
          // Only a refusal (a 4xx but 408/429) surely made nothing. Anything else (no answer in time, a
          // dropped connection, a 5xx) may have stored the Job: it stays counted as starting until the
          // informer shows it or the pending entry lapses, as Kubernetes' own controllers keep their
          // expectations after a create that timed out; dropping it made one Job too many.
          if (err instanceof UnretryableError) this.pending.delete(name);
          throw err;
        });
      }
    }
  }

  /**
   * Claims a ready pod of the run's JobType for the run, or returns null (a miss: none ready, or all
   * taken by others meanwhile). Counts hits and misses of pooled types. `early(pod)` is begun for each
   * candidate as its patch is sent (it must start nothing in the pod: the claim is not won yet) and
   * abandoned unless that claim wins.
   */
  async claim<E extends EarlyStart = never>(spec: RunSpec, early?: (podName: string) => E): Promise<Claim<E> | null> {
    const jt = spec.jobType;
    if (this.stopped || this.sizeOf(jt) <= 0) return null;
    const count = this.counts.get(jt.name) ?? { hits: 0, misses: 0, handOverRetries: 0 };
    this.counts.set(jt.name, count);
    // The run's own JobType (it may be pinned to an earlier build): only pods made from it will do.
    const hash = poolable(jt, spec.requirements) && this.hashes.has(jt.name) ? await this.specHash(jt).catch(() => null) : undefined;
    if (!hash) {
      count.misses++;
      return null;
    }
    const ns = this.o.config.kubernetes.runs_namespace;
    const grace = this.o.config.kubernetes.deadline_grace_seconds;
    const members = this.members();
    for (const name of claimOrder(members, jt.name, hash, this.o.clock.now(), this.maxIdleMs)) {
      const job = this.o.controller.jobs.get(name);
      const pod = this.o.controller.pods.list().find((p) => p.metadata?.labels?.['job-name'] === name);
      if (!job || !pod?.metadata?.name) continue;
      // The cache may have moved on since the order was made (an earlier claim of this loop's awaits,
      // by another run of this replica, came back through the watch): a Job claimed since is not a
      // candidate, and a patch at its new version would succeed and hand one pod to two runs.
      const now = memberOf(job, pod);
      if (!now || now.claimed || now.deleting || this.claiming.has(name)) continue;
      this.claiming.add(name);
      const begun = early?.(pod.metadata.name);
      let updated: V1Job | null = null;
      try {
        updated = await this.o.api.patchJobIfUnchanged(ns, name, claimJobPatch(job, spec, grace, this.o.clock.now()));
        if (!updated) {
          // 409: changed since our cache saw it. Claimed by another replica: next one. Only its status
          // changed (the cache lags): try once more at the version just read.
          const fresh = await this.o.api.getJob(ns, name).catch(() => null);
          const member = fresh ? memberOf(fresh, pod) : null;
          if (fresh && member && !member.claimed && !member.deleting) updated = await this.o.api.patchJobIfUnchanged(ns, name, claimJobPatch(fresh, spec, grace, this.o.clock.now())).catch(() => null);
        }
      } finally {
        if (!updated) {
          this.claiming.delete(name);
          begun?.abandon();
        }
      }
      if (!updated) continue;
      // The pod carries the run's labels too, so `kubectl get pods -l sandpod.io/execution-id=<id>`
      // finds it and the controller's pod events reach the run. Patched while the program is handed
      // over (the run knows its pod by uid already); `labelled` settles when it is done.
      const podName = pod.metadata.name;
      const labelled = this.o.api.patchPod(ns, podName, claimPodPatch(spec)).then((p) => {
        if (!p) throw new Error(`pod ${podName} of claimed Job ${name} is gone`);
      });
      labelled.catch(() => undefined);
      count.hits++;
      void this.kick();
      return { job: updated, pod, labelled, ...(begun ? { early: begun } : {}) };
    }
    count.misses++;
    void this.kick();
    return null;
  }

  /** The run on a claimed pool Job ended (or never started): its refill need not wait any longer. */
  runOver(jobName: string): void {
    this.over.add(jobName);
    void this.kick();
  }

  /** A hand-over to a claimed pod failed before the program started and the run was tried again. */
  noteHandOverRetry(jobType: string): void {
    const count = this.counts.get(jobType) ?? { hits: 0, misses: 0, handOverRetries: 0 };
    count.handOverRetries++;
    this.counts.set(jobType, count);
  }

  /** `/pool/stats` and `/metrics` rows, one per JobType with a pool or with counted runs. */
  stats(): WarmPoolStats[] {
    const now = this.o.clock.now();
    const members = this.members().filter((m) => !m.claimed && !m.deleting);
    const names = new Set<string>([...this.hashes.keys(), ...this.counts.keys()]);
    const sizes = new Map(this.o.jobTypes().map((jt) => [jt.name, poolable(jt) ? this.sizeOf(jt) : 0]));
    return [...names].sort().map((name) => {
      const mine = members.filter((m) => m.jobType === name && m.specHash === this.hashes.get(name));
      const ready = mine.filter((m) => m.ready);
      const ages = ready.map((m) => now - m.createdAt);
      const c = this.counts.get(name) ?? { hits: 0, misses: 0, handOverRetries: 0 };
      return {
        job_type: name,
        target: sizes.get(name) ?? 0,
        ready: ready.length,
        starting: mine.filter((m) => !m.ready && !m.failed).length,
        oldest_age_ms: ages.length ? Math.max(...ages) : null,
        newest_age_ms: ages.length ? Math.min(...ages) : null,
        hits: c.hits,
        misses: c.misses,
        handover_retries: c.handOverRetries,
      };
    });
  }
}
