/**
 * The Kubernetes session pool (issue 19): per job type a few pooled session Jobs
 * (session-pool-plan.ts) whose pods are ready for a session, taken by `claim` in `openSession`. The pool
 * is whatever the Job informer shows with this instance's labels and the session-pool label, so a
 * restarted replica finds its ready pods there. Sizing (`warm_pool.session_sizes`, the demand floor) and
 * the creates and removals are the leader's, reconciled on a timer and after informer events, one pass
 * at a time (decisions: session-pool-decide.ts); every replica claims.
 *
 * A claim is a patch of the pooled Job at the resourceVersion it was read at (409: another replica or a
 * concurrent open of this one took it, or the leader removed it: the next candidate is tried), then of
 * its pod's labels. The claimed Job is the session's for good: it leaves the pool, is deleted when the
 * session ends, and its refill starts at once (background, within the leader's start budget).
 */
import { randomBytes } from 'node:crypto';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import { sessionPoolSizes, type Config } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { KubeApi, ReconnectingInformer } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import type { SessionPoolStats } from '../../session.ts';
import { sessionPoolTargets } from '../../session-pool-sizing.ts';
import { LABELS } from '../names.ts';
import { poolBackoffMs } from '../pool/pool-decide.ts';
import { lastOpenedByType, planSessionPools, sessionClaimOrder, sessionPoolMemberOf, type SessionPoolMember, type SessionPoolWant } from './session-pool-decide.ts';
import { sessionClaimJobPatch, sessionClaimPodPatch, sessionPoolJob } from './session-pool-plan.ts';
import { ReconcileLoop } from '../reconcile-loop.ts';
import type { SourcesRef } from '../runs/runner-sources.ts';

/** Pooled session pods starting at once, all types together. */
const MAX_STARTING = 2;

/** What the session pool needs. */
export interface SessionPoolDeps {
  api: KubeApi;
  config: Config;
  jobs: ReconnectingInformer<V1Job>;
  pods: ReconnectingInformer<V1Pod>;
  clock: Clock;
  log: Logger;
  jobTypes: () => JobType[];
  runtimeClassName: () => Promise<string | null | false>;
  /** The runner sources ConfigMap pooled session pods mount (runs/runner-sources.ts). */
  sources: SourcesRef;
  /** Whether a type's sessions go through the egress proxy (not pooled: session-pool-plan.ts). */
  proxied: (jt: JobType) => boolean;
  /** Whether this replica creates and removes pooled Jobs (the leader's job). */
  leading: () => boolean;
  intervalMs?: number;
}

/** A claimed pooled pod. */
export interface SessionClaim {
  jobName: string;
  podName: string;
}

/** See the module comment. */
export class SessionPool {
  private readonly counts = new Map<string, { hits: number; misses: number }>();
  /** Opens this replica saw, per type (epoch ms): the demand floor. */
  private readonly opened = new Map<string, number>();
  private targets = new Map<string, number>();
  /** Created Jobs the informer has not shown yet (counted as starting). */
  private readonly pending = new Map<string, { jobType: string; specHash: string; at: number }>();
  private readonly failures = new Map<string, { count: number; lastAt: number; seen: Set<string> }>();
  private readonly hashCache = new WeakMap<JobType, { rc: string | null; sources: string; specHash: string }>();

  private readonly loop: ReconcileLoop;

  constructor(private readonly d: SessionPoolDeps) {
    this.loop = new ReconcileLoop(() => this.reconcile(), { what: 'session pool', log: d.log, intervalMs: d.intervalMs });
  }

  private get idleMs(): number {
    return this.d.config.kubernetes.warm_pool_max_idle_seconds * 1000;
  }

  start(): void {
    this.loop.start([(cb) => this.d.jobs.on(cb), (cb) => this.d.pods.on(cb)]);
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

  /** Whether a session of `jt` asking for `requirements` may take a pooled pod: no requirements beyond the type's own, no per-session egress credential. */
  eligible(jt: JobType, requirements: readonly string[] | undefined): boolean {
    if (this.d.proxied(jt)) return false;
    const norm = (r: readonly string[]) => [...new Set(r.map((x) => x.trim()))].sort().join('\n');
    return requirements === undefined || norm(requirements) === norm(jt.requirements);
  }

  /** The spec hash of a type's pooled pods now; null when sessions cannot be made (no RuntimeClass in strict mode). */
  private async specHash(jt: JobType): Promise<string | null> {
    const rc = await this.d.runtimeClassName();
    if (rc === false) return null;
    const sources = this.d.sources.name();
    const hit = this.hashCache.get(jt);
    if (hit && hit.rc === rc && hit.sources === sources) return hit.specHash;
    const { specHash } = sessionPoolJob(jt, this.d.config, { name: 'x', runtimeClassName: rc, sources });
    this.hashCache.set(jt, { rc, sources, specHash });
    return specHash;
  }

  private members(): SessionPoolMember[] {
    const pods = new Map<string, V1Pod>();
    for (const p of this.d.pods.list()) {
      const j = p.metadata?.labels?.['job-name'];
      if (j) pods.set(j, p);
    }
    const out: SessionPoolMember[] = [];
    for (const j of this.d.jobs.list()) {
      const m = sessionPoolMemberOf(j, pods.get(j.metadata?.name ?? ''));
      if (m) out.push(m);
    }
    const now = this.d.clock.now();
    for (const [name, p] of this.pending) {
      if (this.d.jobs.get(name) || now - p.at > 30_000) this.pending.delete(name);
      else out.push({ name, jobType: p.jobType, specHash: p.specHash, createdAt: p.at, ready: false, claimed: false, deleting: false, failed: false });
    }
    return out;
  }

  /** Each pooled type's target now (sizing: runtime/session-pool-sizing.ts); proxied types none. */
  private computeTargets(now: number): Map<string, number> {
    const sizes = sessionPoolSizes(this.d.config);
    const cluster = lastOpenedByType(this.d.jobs.list(), LABELS.jobType);
    const types = this.d.jobTypes().filter((jt) => !this.d.proxied(jt));
    const last = (n: string) => Math.max(this.opened.get(n) ?? 0, cluster.get(n) ?? 0) || null;
    return sessionPoolTargets(now, types.map((jt) => ({ jobType: jt.name, configured: sizes[jt.name] ?? 0, lastOpenedAt: last(jt.name) })), this.idleMs);
  }

  /** Counts pooled pods that failed unclaimed (each once), resets a type's count once one is ready; until when each type is held. */
  private holds(members: readonly SessionPoolMember[], now: number): Map<string, number> {
    for (const m of members) {
      if (m.claimed || m.deleting) continue;
      if (m.ready) this.failures.delete(m.jobType);
      if (!m.failed) continue;
      const f = this.failures.get(m.jobType) ?? { count: 0, lastAt: now, seen: new Set<string>() };
      if (f.seen.has(m.name)) continue;
      f.seen.add(m.name);
      f.count++;
      f.lastAt = now;
      this.failures.set(m.jobType, f);
      this.d.log.warn({ job: m.name, job_type: m.jobType, failures: f.count, why: m.failedWhy }, 'a pooled session pod failed');
    }
    return new Map([...this.failures].map(([jt, f]) => [jt, f.lastAt + poolBackoffMs(f.count)]));
  }

  private async reconcile(): Promise<void> {
    if (!this.d.jobs.synced || !this.d.pods.synced) return;
    const now = this.d.clock.now();
    this.targets = this.computeTargets(now);
    if (!this.d.leading()) return;
    const wants: SessionPoolWant[] = [];
    const byName = new Map(this.d.jobTypes().map((jt) => [jt.name, jt]));
    for (const [name, target] of this.targets) {
      const specHash = await this.specHash(byName.get(name)!);
      if (specHash) wants.push({ jobType: name, target, specHash });
    }
    const members = this.members();
    const plan = planSessionPools(wants, members, now, { idleMs: this.idleMs, maxStarting: MAX_STARTING, holdUntil: this.holds(members, now) });
    const ns = this.d.config.kubernetes.runs_namespace;
    for (const r of plan.remove) {
      // Only as we saw it: a Job claimed since is a session's now, and the precondition keeps it.
      const rv = this.d.jobs.get(r.name)?.metadata?.resourceVersion;
      if (!rv) continue;
      this.d.log.info({ job: r.name, reason: r.reason }, 'removing pooled session Job');
      await this.d.api.deleteJobIfUnchanged(ns, r.name, rv);
    }
    if (plan.create.length > 0) await this.d.sources.ensure(); // the pods mount the runner from it
    for (const c of plan.create) {
      const jt = byName.get(c.jobType);
      const rc = await this.d.runtimeClassName();
      if (!jt || rc === false) continue;
      for (let i = 0; i < c.count; i++) {
        const { job, specHash } = sessionPoolJob(jt, this.d.config, { name: `sps-p-${randomBytes(6).toString('hex')}`, runtimeClassName: rc, sources: this.d.sources.name() });
        const name = job.metadata!.name!;
        this.pending.set(name, { jobType: jt.name, specHash, at: this.d.clock.now() });
        await this.d.api.createJob(job).catch((err: unknown) => {
          this.pending.delete(name);
          throw err;
        });
      }
    }
  }

  /**
   * Takes a ready pooled pod of `jt` for the session, or returns null (a miss: none ready, or each one
   * tried was taken or removed meanwhile). Call only for {@link eligible} sessions; counts hits and misses.
   */
  async claim(jt: JobType, sessionId: string, lifetimeSec: number): Promise<SessionClaim | null> {
    const now0 = this.d.clock.now();
    this.opened.set(jt.name, now0);
    const count = this.counts.get(jt.name) ?? { hits: 0, misses: 0 };
    this.counts.set(jt.name, count);
    const hash = this.stopped ? null : await this.specHash(jt).catch(() => null);
    const ns = this.d.config.kubernetes.runs_namespace;
    for (const name of hash ? sessionClaimOrder(this.members(), jt.name, hash) : []) {
      const job = this.d.jobs.get(name);
      const pod = this.d.pods.list().find((p) => p.metadata?.labels?.['job-name'] === name);
      // The cache may have moved on during an earlier candidate's awaits: take it only as it is now.
      const m = job ? sessionPoolMemberOf(job, pod) : null;
      if (!job || !pod?.metadata?.name || !m?.ready || m.claimed) continue;
      const claimed = await this.d.api.patchJobIfUnchanged(ns, name, sessionClaimJobPatch(job, sessionId, lifetimeSec, this.d.clock.now()));
      if (!claimed) continue;
      const podName = pod.metadata.name;
      if (!(await this.labelPod(ns, pod, sessionId))) {
        // Gone meanwhile: the claimed Job is useless; the next candidate, or a cold start.
        await this.d.api.deleteJob(ns, name).catch(() => undefined);
        continue;
      }
      count.hits++;
      void this.kick();
      return { jobName: name, podName };
    }
    count.misses++;
    void this.kick();
    return null;
  }

  /** Labels the claimed pod with the session id; false when the pod is gone. */
  private async labelPod(ns: string, pod: V1Pod, sessionId: string): Promise<boolean> {
    const name = pod.metadata!.name!;
    let rv = pod.metadata?.resourceVersion ?? '';
    for (let i = 0; i < 3; i++) {
      if (await this.d.api.patchPodIfUnchanged(ns, name, sessionClaimPodPatch(rv, sessionId))) return true;
      // 409 (its status moved on since the cache saw it) or 404: read it again.
      const fresh = await this.d.api.getPod(ns, name);
      if (!fresh || fresh.metadata?.deletionTimestamp) return false;
      rv = fresh.metadata?.resourceVersion ?? '';
    }
    return false;
  }

  /** `/pool/stats` `sessions` and `/metrics` rows: one per pooled type or type with counted opens. */
  stats(): SessionPoolStats[] {
    const members = this.members().filter((m) => !m.claimed && !m.deleting && !m.failed);
    const names = new Set<string>([...[...this.targets].filter(([, t]) => t > 0).map(([n]) => n), ...this.counts.keys(), ...members.map((m) => m.jobType)]);
    return [...names].sort().map((name) => {
      const mine = members.filter((m) => m.jobType === name);
      const c = this.counts.get(name) ?? { hits: 0, misses: 0 };
      return { job_type: name, target: this.targets.get(name) ?? 0, ready: mine.filter((m) => m.ready).length, starting: mine.filter((m) => !m.ready).length, hits: c.hits, misses: c.misses };
    });
  }
}
