/**
 * The Kubernetes runtime: every run is a batch/v1 Job (plus a Secret with its code and input) in the
 * runs namespace; a controller watches the run pods, reports the startup → execution transition,
 * pulls `/output` from the `collector` sidecar and resolves the run with a {@link RawRun}.
 *
 * Failure policy: `run()` makes plain API calls and rejects on the first one that fails; the
 * service's single breaker + retry around each run attempt (executions/) counts it once and runs the
 * attempt again. Every create uses the execution's deterministic name and treats 409 as success, so a
 * retried attempt picks up what an earlier one left. Once the run is tracked, the controller's work
 * queue retries its own calls with backoff, outside the breaker.
 */
import { readFileSync } from 'node:fs';
import type { KubeConfig, V1Job, V1Secret } from '@kubernetes/client-node';
import { systemClock, type Clock } from '../../clock.ts';
import type { Config } from '../../config.ts';
import { KubeApi, defaultKubeConfig } from '../../kube/index.ts';
import { silentLogger, type Logger } from '../../logger.ts';
import { RUNNER_PATH } from '../../sandbox/paths.ts';
import { baseObservation, emptyRun } from '../run-output.ts';
import { RunGoneError, type RawRun, type RunOptions, type RunSpec, type Runtime, type RuntimeHealth, type RuntimeHooks } from '../runtime.ts';
import { buildJob, ownSecret } from './build-job.ts';
import { RunController } from './controller.ts';
import { newRunState, toMs } from './decide.ts';
import { ANNOTATIONS, LABELS, executionLabel, jobNameFor } from './names.ts';
import { defaultOutputLimits } from './output-tar.ts';

/** Constructor options of {@link createKubernetesRuntime}. */
export interface KubernetesRuntimeOptions {
  /** Client configuration; default `KubeConfig.loadFromDefault()` (in-cluster service account or `KUBECONFIG`). */
  kubeConfig?: KubeConfig;
  /** Needed by `start()` to garbage-collect Jobs whose record is terminal or missing. */
  hooks?: RuntimeHooks;
  clock?: Clock;
  logger?: Logger;
  /** Text of the runner shipped to every run; default: `src/sandbox/runner.py` read at creation. */
  runnerSource?: string;
  /** Tuning, mostly for tests. */
  tuning?: {
    podGoneGraceMs?: number;
    execTimeoutMs?: number;
    collectAttempts?: number;
    informerBackoffInitialMs?: number;
    informerBackoffMaxMs?: number;
    watchTimeoutSeconds?: number;
    /** How long health facts and the RuntimeClass lookup are cached, ms. */
    healthCacheMs?: number;
  };
}

/** The path of the runner every runtime uses (named once, in src/sandbox/paths.ts). */
export { RUNNER_PATH };

/**
 * Creates the Kubernetes runtime. Nothing touches the cluster until `start()`, which syncs the
 * informers and deletes Jobs of this instance whose execution is no longer live (per `hooks`).
 */
export function createKubernetesRuntime(config: Config, options: KubernetesRuntimeOptions = {}): Runtime {
  return new KubernetesRuntime(config, options);
}

class KubernetesRuntime implements Runtime {
  readonly name = 'kubernetes';
  private readonly kc: KubeConfig;
  private readonly api: KubeApi;
  private readonly controller: RunController;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly ns: string;
  private runnerSource: string | null;
  private runtimeClass: { exists: boolean | null; at: number } = { exists: null, at: 0 };
  private healthCache: { value: RuntimeHealth; at: number } | null = null;
  private started = false;

  constructor(
    private readonly config: Config,
    private readonly options: KubernetesRuntimeOptions,
  ) {
    this.kc = options.kubeConfig ?? defaultKubeConfig();
    this.clock = options.clock ?? systemClock;
    this.log = options.logger ?? silentLogger;
    this.ns = config.kubernetes.runs_namespace;
    this.api = new KubeApi(this.kc);
    this.runnerSource = options.runnerSource ?? null;
    const t = options.tuning ?? {};
    this.controller = new RunController({
      kubeConfig: this.kc,
      api: this.api,
      namespace: this.ns,
      instance: config.kubernetes.instance,
      clock: this.clock,
      logger: this.log,
      ...(t.execTimeoutMs !== undefined ? { execTimeoutMs: t.execTimeoutMs } : {}),
      ...(t.collectAttempts !== undefined ? { collectAttempts: t.collectAttempts } : {}),
      ...(t.informerBackoffInitialMs !== undefined ? { informerBackoffInitialMs: t.informerBackoffInitialMs } : {}),
      ...(t.informerBackoffMaxMs !== undefined ? { informerBackoffMaxMs: t.informerBackoffMaxMs } : {}),
      ...(t.watchTimeoutSeconds !== undefined ? { watchTimeoutSeconds: t.watchTimeoutSeconds } : {}),
    });
  }

  /** Informers, request counters etc. for tests and the bench. */
  get internals(): { controller: RunController; api: KubeApi } {
    return { controller: this.controller, api: this.api };
  }

  async start(): Promise<void> {
    if (this.started) return;
    this.runner();
    await this.controller.start();
    this.started = true;
    await this.refreshRuntimeClass();
    await this.collectGarbage();
  }

  async stop(): Promise<void> {
    this.controller.stop();
    this.started = false;
  }

  async health(): Promise<RuntimeHealth> {
    const ttl = this.options.tuning?.healthCacheMs ?? 5000;
    const now = this.clock.now();
    if (this.healthCache && now - this.healthCache.at < ttl) return this.healthCache.value;
    let available = false;
    let error: string | undefined;
    try {
      // Listing Jobs proves the API answers and that our role in the runs namespace works.
      await this.api.listJobs(this.ns, `${LABELS.instance}=${this.config.kubernetes.instance}`, 1);
      available = true;
    } catch (err) {
      error = err instanceof Error ? err.message : String(err);
    }
    const gvisor = (available ? await this.refreshRuntimeClass(true) : this.runtimeClass.exists) === true;
    const value: RuntimeHealth = {
      available,
      gvisorAvailable: gvisor,
      engine: 'kubernetes',
      isolated: true,
      limits: 'kubernetes',
      detail: {
        runs_namespace: this.ns,
        runtime_class: this.config.kubernetes.runtime_class,
        informers_synced: this.controller.pods.synced && this.controller.jobs.synced,
        runs_in_flight: this.controller.inFlight,
        ...(error ? { error } : {}),
      },
    };
    this.healthCache = { value, at: now };
    return value;
  }

  async run(spec: RunSpec, options: RunOptions = {}): Promise<RawRun> {
    if (!this.started) throw new Error('kubernetes runtime: start() was not called');
    const key = executionLabel(spec.executionId);
    const jobName = jobNameFor(spec.executionId);
    if (this.controller.has(key)) throw new Error(`execution ${spec.executionId} is already being run by this process`);
    const t = this.options.tuning ?? {};
    let startedAt = this.clock.now();
    let jobSeen = false;

    // Adopting creates nothing but a missing Secret, whose contents do not depend on the RuntimeClass.
    const runtimeClassName = options.adopt ? await this.runtimeClassFor().catch(() => null) : await this.runtimeClassFor();
    const { secret, job } = buildJob(spec, spec.jobType, this.config, {
      runtimeClassName: runtimeClassName === false ? null : runtimeClassName,
      runnerSource: this.runner(),
    });

    let adopted: V1Job | null = null;
    if (options.adopt) {
      adopted = await this.api.getJob(this.ns, jobName);
      if (!adopted) throw new RunGoneError(`no Job ${jobName} for execution ${spec.executionId}`);
      startedAt = toMs(adopted.metadata?.creationTimestamp) ?? startedAt;
      jobSeen = true;
    } else {
      if (options.signal?.aborted) return cancelledBeforeStart(startedAt);
      if (runtimeClassName === false) {
        return infraFailure(startedAt, 'config_error', `security_mode strict requires RuntimeClass ${this.config.kubernetes.runtime_class}, which does not exist in the cluster`);
      }
    }

    // Tracked before anything is created: the controller then hears of every event of the run's
    // objects, even a pod that comes and goes before the creates return.
    const tracked = this.controller.track(key, {
      state: newRunState({
        executionId: spec.executionId,
        jobName,
        startedAt,
        startupTimeoutMs: spec.startupTimeoutSec * 1000,
        podGoneGraceMs: t.podGoneGraceMs ?? 3000,
        jobSeen,
      }),
      limits: defaultOutputLimits(spec.maxArtifactBytes, spec.maxStdoutBytes),
      ...(options.onPhase ? { onPhase: options.onPhase } : {}),
      ...(adopted?.metadata?.uid ? { jobUid: adopted.metadata.uid } : {}),
    });
    // Awaited below; until then a rejection (runtime stopped) must not count as unhandled.
    tracked.catch(() => undefined);
    try {
      if (adopted) {
        const finished = adopted.status?.conditions?.some((c) => (c.type === 'Complete' || c.type === 'Failed') && c.status === 'True');
        // The process that created the Job may have died before its Secret existed.
        if (!finished) await this.ensureSecret(secret, adopted);
      } else {
        const owner = await this.ensureJob(job, jobName);
        // From now on the controller takes only this Job and its pods as the run's: a Job of the
        // same name from an earlier attempt, and its pod, may still be terminating.
        this.controller.ownJob(key, owner.metadata?.uid ?? '');
        try {
          await this.ensureSecret(secret, owner);
        } catch (err) {
          // Without its Secret the pod can never start; remove the Job so a retry starts clean.
          await this.api.deleteJob(this.ns, jobName).catch(() => undefined);
          throw err;
        }
      }
    } catch (err) {
      this.controller.untrack(key);
      throw err;
    }

    // Cancellation is heard only now: a cancel during the creates would delete a Job not yet made.
    const onAbort = () => this.controller.cancel(key);
    options.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      if (options.signal?.aborted) this.controller.cancel(key);
      return await tracked;
    } finally {
      options.signal?.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Creates the run's Job, or takes the one an earlier attempt (or another replica) created under the
   * same deterministic name: 409 is success.
   */
  private async ensureJob(job: V1Job, jobName: string): Promise<V1Job> {
    const created = await this.api.createJob(job);
    if (created?.metadata?.uid) return created;
    const existing = await this.api.getJob(this.ns, jobName);
    if (!existing) throw new Error(`Job ${jobName} existed and vanished at once; retry`);
    if (existing.metadata?.deletionTimestamp) throw new Error(`Job ${jobName} of an earlier attempt is still being deleted; retry`);
    return existing;
  }

  /**
   * Creates the run's Secret owned by `owner`; 409 is success when the Secret there is owned by that
   * same Job. A Secret still naming a Job of an earlier attempt that was deleted (its create failed
   * after the server had stored it) would be garbage-collected under the new pod: it is replaced.
   */
  private async ensureSecret(secret: V1Secret, owner: V1Job): Promise<void> {
    const mine = ownSecret(secret, owner);
    if (await this.api.createSecret(mine)) return;
    const name = mine.metadata?.name ?? '';
    const existing = await this.api.getSecret(this.ns, name);
    if (existing?.metadata?.ownerReferences?.some((r) => r.uid === owner.metadata?.uid)) return;
    await this.api.deleteSecret(this.ns, name);
    if (!(await this.api.createSecret(mine))) throw new Error(`Secret ${name} was re-created while being replaced; retry`);
  }

  /** The runner text, read once. */
  private runner(): string {
    if (this.runnerSource === null) this.runnerSource = readFileSync(RUNNER_PATH, 'utf8');
    return this.runnerSource;
  }

  /**
   * The RuntimeClass to put on a run: always the configured one in `strict` (false when it is known
   * not to exist), in `permissive` only when it exists.
   */
  private async runtimeClassFor(): Promise<string | null | false> {
    const name = this.config.kubernetes.runtime_class;
    const exists = await this.refreshRuntimeClass();
    // Unknown is not "absent": in strict mode that would fail the run as a config error on an API blip.
    if (exists === null) throw new Error(`cannot read RuntimeClass ${name}; retry`);
    if (this.config.security_mode === 'strict') return exists === false ? false : name;
    return exists ? name : null;
  }

  /** Whether the RuntimeClass exists, cached (a stale answer beats none); null when unknown (API error). */
  private async refreshRuntimeClass(force = false): Promise<boolean | null> {
    const ttl = this.options.tuning?.healthCacheMs ?? 60_000;
    const now = this.clock.now();
    if (!force && this.runtimeClass.exists !== null && now - this.runtimeClass.at < Math.max(ttl, 30_000)) return this.runtimeClass.exists;
    try {
      const exists = await this.api.runtimeClassExists(this.config.kubernetes.runtime_class);
      this.runtimeClass = { exists, at: now };
      return exists;
    } catch (err) {
      this.log.warn({ err: String(err) }, 'cannot read RuntimeClass');
      return this.runtimeClass.exists;
    }
  }

  /** Deletes Jobs of this instance whose execution is terminal or unknown (SPEC §1.12). */
  private async collectGarbage(): Promise<void> {
    const hooks = this.options.hooks;
    if (!hooks) return;
    const jobs = this.controller.jobs.list();
    const byId = new Map<string, string>();
    for (const j of jobs) {
      const id = j.metadata?.annotations?.[ANNOTATIONS.executionId] ?? j.metadata?.labels?.[LABELS.executionId];
      if (id && j.metadata?.name) byId.set(id, j.metadata.name);
    }
    if (byId.size === 0) return;
    const live = await hooks.liveExecutionIds([...byId.keys()]);
    for (const [id, name] of byId) {
      if (live.has(id)) continue;
      try {
        await this.api.deleteJob(this.ns, name);
        this.log.info({ execution_id: id, job: name }, 'deleted orphaned run Job');
      } catch (err) {
        this.log.warn({ execution_id: id, job: name, err: String(err) }, 'could not delete orphaned run Job');
      }
    }
  }
}

function cancelledBeforeStart(startedAt: number): RawRun {
  return emptyRun(baseObservation(startedAt, { cancelled: true }));
}

function infraFailure(startedAt: number, type: string, message: string): RawRun {
  return emptyRun(baseObservation(startedAt, { infraError: { type, message } }));
}
