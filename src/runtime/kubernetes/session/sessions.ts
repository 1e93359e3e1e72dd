/**
 * Sessions on the Kubernetes runtime (issue 19): `openSession` makes the session's own Job
 * (session-job.ts), waits for its pod's collector and its runner, and hands out the pod as a
 * {@link KubeSessionSandbox}; `adoptSession` finds the live pod of a session another process held
 * (by its session-id label) and attaches to it again.
 */
import { randomUUID } from 'node:crypto';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { KubeApi, ReconnectingInformer } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import type { SessionOpenOptions, SessionSandbox } from '../../session.ts';
import type { EgressCredentials } from '../runs/egress.ts';
import { ensureJob } from '../runs/run-objects.ts';
import { podEnd, podTrouble } from './session-decide.ts';
import { SESSION_LABELS, sessionJob, sessionJobName } from './session-job.ts';
import { KubeSessionSandbox, type KubeSessionDeps } from './session-sandbox.ts';

/** How long an adoption may take to reach a live pod's runner, ms. */
const ADOPT_TIMEOUT_MS = 30_000;

/** What sessions need from the runtime. */
export interface KubeSessionsDeps {
  api: KubeApi;
  config: Config;
  pods: ReconnectingInformer<V1Pod>;
  clock: Clock;
  log: Logger;
  runtimeClassName: () => Promise<string | null | false>;
  runnerSource: () => string;
  collectorSource: () => string;
  egress: EgressCredentials;
}

/** The runtime's sessions part. */
export class KubeSessions {
  private readonly ns: string;
  private readonly sandboxDeps: KubeSessionDeps;

  constructor(private readonly d: KubeSessionsDeps) {
    this.ns = d.config.kubernetes.runs_namespace;
    this.sandboxDeps = { api: d.api, ns: this.ns, pods: () => d.pods.list(), now: () => d.clock.now(), log: d.log };
  }

  private podOf(sessionId: string, jobUid?: string): V1Pod | undefined {
    return this.d.pods
      .list()
      .filter((p) => p.metadata?.labels?.[SESSION_LABELS.sessionId] === sessionId && (!jobUid || p.metadata?.ownerReferences?.some((r) => r.uid === jobUid)))
      .sort((a, b) => Number(!!a.metadata?.deletionTimestamp) - Number(!!b.metadata?.deletionTimestamp))[0];
  }

  /** Starts a session's pod and resolves once its runner is ready; rejects (its Job deleted) when it cannot. */
  async open(jobType: JobType, o: SessionOpenOptions): Promise<SessionSandbox> {
    const { config, api, clock } = this.d;
    const sessionId = o.sessionId ?? randomUUID();
    const deadline = clock.now() + o.startupMs;
    const runtimeClassName = await this.d.runtimeClassName();
    if (runtimeClassName === false) throw new Error(`security_mode strict requires RuntimeClass ${config.kubernetes.runtime_class}, which does not exist in the cluster`);
    const name = sessionJobName(sessionId);
    const job = sessionJob(jobType, config, {
      sessionId,
      name,
      runtimeClassName,
      runnerSource: this.d.runnerSource(),
      collectorSource: this.d.collectorSource(),
      requirements: o.requirements ?? jobType.requirements,
      lifetimeSec: o.lifetimeSec ?? 3600,
      egressProxy: await this.d.egress.forJob({ jobType }),
    });
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

  /** The live pod of a session another process held, attached again; null when there is none (its Job is removed). */
  async adopt(sessionId: string): Promise<SessionSandbox | null> {
    const name = sessionJobName(sessionId);
    let pod = this.podOf(sessionId);
    if (!pod) pod = (await this.d.api.listPods(this.ns, `${SESSION_LABELS.sessionId}=${sessionId}`)).items[0];
    const podName = pod?.metadata?.name;
    if (!podName || podEnd(pod) !== 'attachable') {
      await this.d.api.deleteJob(this.ns, name).catch(() => undefined);
      return null;
    }
    try {
      const s = await KubeSessionSandbox.connect(this.sandboxDeps, sessionId, name, podName, this.d.clock.now() + ADOPT_TIMEOUT_MS);
      if (!s.ended) return s;
    } catch (err) {
      this.d.log.warn({ session_id: sessionId, pod: podName, err: String(err) }, 'could not adopt the session pod');
    }
    await this.d.api.deleteJob(this.ns, name).catch(() => undefined);
    return null;
  }
}
