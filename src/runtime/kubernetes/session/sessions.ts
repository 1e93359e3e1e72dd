/**
 * Sessions on the Kubernetes runtime (issue 19): `openSession` takes a ready pod of the session pool
 * (session-pool.ts) when the session may have one, or else makes the session's own Job
 * (session-job.ts) and waits for its pod's collector and its runner; either way it hands out the pod
 * as a {@link KubeSessionSandbox}. `adoptSession` finds the live pod of a session another process held
 * (by its session-id label) and attaches to it again. A session's Job is named after the session
 * when it started cold (`sps-<id>`) and randomly when it came from the pool (`sps-p-…`): everything
 * that removes it uses the name of the Job that holds the pod, never one derived from the id.
 */
import { randomUUID } from 'node:crypto';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { KubeApi, ReconnectingInformer } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import type { SessionOpenOptions, SessionPoolStats, SessionSandbox } from '../../session.ts';
import type { EgressCredentials } from '../runs/egress.ts';
import { ensureJob } from '../runs/run-objects.ts';
import type { SourcesRef } from '../runs/runner-sources.ts';
import { podEnd, podTrouble } from './session-decide.ts';
import { SESSION_LABELS, sessionJob, sessionJobName } from './session-job.ts';
import { SESSION_POOL_LABELS } from './session-pool-plan.ts';
import { KubeSessionSandbox, type KubeSessionDeps } from './session-sandbox.ts';
import { SessionPool } from './session-pool.ts';

/** How long attaching to a claimed pooled pod may take before the session starts cold instead, ms. */
const WARM_CONNECT_MS = 10_000;

/** How long an adoption may take to reach a live pod's runner, ms. */
const ADOPT_TIMEOUT_MS = 30_000;

/** What sessions need from the runtime. */
export interface KubeSessionsDeps {
  api: KubeApi;
  config: Config;
  pods: ReconnectingInformer<V1Pod>;
  jobs: ReconnectingInformer<V1Job>;
  clock: Clock;
  log: Logger;
  runtimeClassName: () => Promise<string | null | false>;
  /** The runner sources ConfigMap session pods mount (runs/runner-sources.ts). */
  sources: SourcesRef;
  egress: EgressCredentials;
}

/** The runtime's sessions part. */
export class KubeSessions {
  private readonly ns: string;
  private readonly sandboxDeps: KubeSessionDeps;
  /** The session pool, once started (without it every session starts its own pod). */
  private pool: SessionPool | null = null;

  constructor(private readonly d: KubeSessionsDeps) {
    this.ns = d.config.kubernetes.runs_namespace;
    this.sandboxDeps = { api: d.api, ns: this.ns, pods: () => d.pods.list(), now: () => d.clock.now(), log: d.log };
  }

  /** Starts the session pool (session-pool.ts): ready pods per job type, sized and made by the leader. */
  startPool(jobTypes: () => JobType[], leading: () => boolean, intervalMs?: number): void {
    const d = this.d;
    this.pool = new SessionPool({ ...d, jobTypes, leading, proxied: (jt) => d.egress.proxied(jt), ...(intervalMs !== undefined ? { intervalMs } : {}) });
    this.pool.start();
  }

  /** The pool: stopped, reconciled now (leadership changed), its stats. */
  stopPool = (): void => this.pool?.stop();
  kickPool = (): void => void this.pool?.kick();
  poolStats = (): SessionPoolStats[] => this.pool?.stats() ?? [];

  private podOf(sessionId: string, jobUid?: string): V1Pod | undefined {
    return this.d.pods
      .list()
      .filter((p) => p.metadata?.labels?.[SESSION_LABELS.sessionId] === sessionId && (!jobUid || p.metadata?.ownerReferences?.some((r) => r.uid === jobUid)))
      .sort((a, b) => Number(!!a.metadata?.deletionTimestamp) - Number(!!b.metadata?.deletionTimestamp))[0];
  }

  /** Takes a ready pooled pod, or starts a session's pod; resolves once its runner is ready; rejects (its Job deleted) when it cannot. */
  async open(jobType: JobType, o: SessionOpenOptions): Promise<SessionSandbox> {
    const { config, api, clock } = this.d;
    const sessionId = o.sessionId ?? randomUUID();
    const deadline = clock.now() + o.startupMs;
    const warm = await this.openWarm(jobType, o, sessionId, deadline);
    if (warm) return warm;
    const runtimeClassName = await this.d.runtimeClassName();
    if (runtimeClassName === false) throw new Error(`security_mode strict requires RuntimeClass ${config.kubernetes.runtime_class}, which does not exist in the cluster`);
    const name = sessionJobName(sessionId);
    const job = sessionJob(jobType, config, {
      sessionId,
      name,
      runtimeClassName,
      sources: this.d.sources.name(),
      requirements: o.requirements ?? jobType.requirements,
      lifetimeSec: o.lifetimeSec ?? 3600,
      egressProxy: await this.d.egress.forJob({ jobType }),
    });
    await this.d.sources.ensure();
    const owner = await ensureJob(api, this.ns, job, name);
    try {
      const uid = owner.metadata?.uid ?? '';
      const pod = await this.attachable(sessionId, uid, deadline);
      // A pod that ends meanwhile (its runner could not start) answers no hello: that ends the wait.
      const watch = this.endWatch(sessionId, uid);
      try {
        return await Promise.race([KubeSessionSandbox.connect(this.sandboxDeps, sessionId, name, pod, deadline), watch.ended]);
      } finally {
        watch.stop();
      }
    } catch (err) {
      await api.deleteJob(this.ns, name).catch(() => undefined);
      throw err;
    }
  }

  /**
   * The session on a claimed pooled pod (its Job and pod labelled with the session id, its deadline the
   * session's), or null: the session may not take one (requirements, egress), none was ready, or the
   * claimed one could not be reached (its Job is then deleted and the session starts cold).
   */
  private async openWarm(jobType: JobType, o: SessionOpenOptions, sessionId: string, deadline: number): Promise<SessionSandbox | null> {
    const pool = this.pool;
    if (!pool?.eligible(jobType, o.requirements)) return null;
    const claim = await pool.claim(jobType, sessionId, o.lifetimeSec ?? 3600);
    if (!claim) return null;
    try {
      const s = await KubeSessionSandbox.connect(this.sandboxDeps, sessionId, claim.jobName, claim.podName, Math.min(deadline, this.d.clock.now() + WARM_CONNECT_MS), true);
      if (!s.ended) return s;
      this.d.log.warn({ session_id: sessionId, job: claim.jobName, why: s.ended.detail }, 'a claimed pooled session pod had ended; starting one');
    } catch (err) {
      this.d.log.warn({ session_id: sessionId, job: claim.jobName, err: String(err) }, 'could not reach a claimed pooled session pod; starting one');
    }
    await this.d.api.deleteJob(this.ns, claim.jobName).catch(() => undefined);
    return null;
  }

  /** Waits until the session's pod can be attached to; its name. */
  private async attachable(sessionId: string, jobUid: string, deadline: number): Promise<string> {
    let wake: (() => void) | null = null;
    const off = this.d.pods.on((_e, p) => {
      if (p.metadata?.labels?.[SESSION_LABELS.sessionId] === sessionId) wake?.();
    });
    try {
      for (;;) {
        const pod = this.podOf(sessionId, jobUid);
        const state = podEnd(pod);
        if (state === 'attachable') return pod!.metadata!.name!;
        if (state === 'ended' || state === 'gone') throw new Error(`the session's pod could not start: ${podTrouble(pod)}`);
        const left = deadline - this.d.clock.now();
        if (left <= 0) throw new Error(`the session's pod did not start in time (${podTrouble(pod)})`);
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, Math.min(left, 250));
          wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
        wake = null;
      }
    } finally {
      off();
    }
  }

  /**
   * The leader's sweep: deletes the session Jobs (of this instance, as listed) whose session has ended
   * or is unknown. The holder deletes its session's Job when the session ends; this catches a delete
   * that failed, or a holder that died with nobody left to adopt (the Job's deadline is the backstop).
   */
  async collectGarbage(jobs: readonly V1Job[], liveSessionIds: (ids: string[]) => Promise<Set<string>>): Promise<void> {
    const byId = new Map<string, string>();
    for (const j of jobs) {
      const id = j.metadata?.labels?.[SESSION_LABELS.sessionId];
      if (id && j.metadata?.name && !j.metadata.deletionTimestamp) byId.set(id, j.metadata.name);
    }
    if (byId.size === 0) return;
    const live = await liveSessionIds([...byId.keys()]);
    for (const [id, name] of byId) {
      if (live.has(id)) continue;
      try {
        await this.d.api.deleteJob(this.ns, name);
        this.d.log.info({ session_id: id, job: name }, 'deleted the Job of an ended session');
      } catch (err) {
        this.d.log.warn({ session_id: id, job: name, err: String(err) }, 'could not delete the Job of an ended session');
      }
    }
  }

  /** Rejects once the session's pod ended or is being deleted (until `stop`). */
  private endWatch(sessionId: string, jobUid: string): { ended: Promise<never>; stop: () => void } {
    let stop: () => void = () => undefined;
    const ended = new Promise<never>((_, reject) => {
      const check = () => {
        const pod = this.podOf(sessionId, jobUid);
        const state = podEnd(pod);
        if (state === 'ended' || state === 'gone') reject(new Error(`the session's pod ended at its start: ${podTrouble(pod)}`));
      };
      stop = this.d.pods.on((_e, p) => {
        if (p.metadata?.labels?.[SESSION_LABELS.sessionId] === sessionId) check();
      });
      check();
    });
    ended.catch(() => undefined);
    return { ended, stop: () => stop() };
  }

  /**
   * The Job that holds a session's pod, by the pod's owner (or `job-name` label), else by the Job's own
   * session-id label (a pooled Job whose claim did not reach its pod), else the cold start's name.
   */
  private async jobOf(sessionId: string, pod: V1Pod | undefined): Promise<V1Job | string> {
    const owner = pod?.metadata?.ownerReferences?.find((r) => r.kind === 'Job')?.name ?? pod?.metadata?.labels?.['job-name'];
    if (owner) return owner;
    const byLabel = (j: V1Job) => j.metadata?.labels?.[SESSION_LABELS.sessionId] === sessionId;
    const job = this.d.jobs.list().find(byLabel) ?? (await this.d.api.listJobs(this.ns, `${SESSION_LABELS.sessionId}=${sessionId}`).catch(() => ({ items: [] as V1Job[] }))).items.find(byLabel);
    return job ?? sessionJobName(sessionId);
  }

  /** The live pod of a session another process held, attached again; null when there is none (its Job is removed). */
  async adopt(sessionId: string): Promise<SessionSandbox | null> {
    let pod = this.podOf(sessionId);
    if (!pod) pod = (await this.d.api.listPods(this.ns, `${SESSION_LABELS.sessionId}=${sessionId}`)).items[0];
    const job = await this.jobOf(sessionId, pod);
    const name = typeof job === 'string' ? job : job.metadata!.name!;
    // A claimed pooled Job whose pod was not labelled yet: its pod, by the Job's name.
    if (!pod && typeof job !== 'string') pod = this.d.pods.list().find((p) => p.metadata?.labels?.['job-name'] === name);
    const podName = pod?.metadata?.name;
    if (!podName || podEnd(pod) !== 'attachable') {
      await this.d.api.deleteJob(this.ns, name).catch(() => undefined);
      return null;
    }
    const warm = !!pod?.metadata?.labels?.[SESSION_POOL_LABELS.pool];
    try {
      const s = await KubeSessionSandbox.connect(this.sandboxDeps, sessionId, name, podName, this.d.clock.now() + ADOPT_TIMEOUT_MS, warm);
      if (!s.ended) return s;
    } catch (err) {
      this.d.log.warn({ session_id: sessionId, pod: podName, err: String(err) }, 'could not adopt the session pod');
    }
    await this.d.api.deleteJob(this.ns, name).catch(() => undefined);
    return null;
  }
}
