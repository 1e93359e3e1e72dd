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
import path from 'node:path';
import type { KubeConfig } from '@kubernetes/client-node';
import { systemClock, type Clock } from '../../clock.ts';
import type { Config } from '../../config.ts';
import { KubeApi, defaultKubeConfig } from '../../kube/index.ts';
import { silentLogger, type Logger } from '../../logger.ts';
import { RUNNER_PATH } from '../../sandbox/paths.ts';
import { baseObservation, emptyRun } from '../run-output.ts';
import { patchJobTypeStatus } from '../../jobtypes/kubernetes-registry.ts';
import { KubernetesBuilder } from './builds/builder.ts';
import { assertHeld, type Builder, type LeadershipStatus, type WarmPoolStats, type RawRun, type RunOptions, type RunSpec, type Runtime, type RuntimeHealth, type RuntimeHooks } from '../runtime.ts';
import { type SessionOpenOptions, type SessionPoolStats, type SessionSandbox } from '../session.ts';
import { KubeSessions } from './session/sessions.ts';
import type { JobType } from '../../jobtypes/job-type.ts';
import { buildJob } from './runs/build-job.ts';
import { EgressCredentials } from './runs/egress.ts';
import { RunnerSources } from './runs/runner-sources.ts';
import { collectGarbage, ensureJob, ensureSecret, secretForJob } from './runs/run-objects.ts';
import { Leadership } from './leadership.ts';
import { runtimeHealth } from './health.ts';
import { RuntimeClassLookup } from './runtime-class.ts';
import { WarmPool } from './pool/pool.ts';
import { RunController } from './runs/controller.ts';
import { newRunState, toMs } from './runs/decide.ts';
import { executionLabel, jobNameFor } from './names.ts';
import { earlierJob, type EarlierJobDeps } from './runs/earlier-job.ts';
import { POOL_LABELS, poolable } from './pool/pool-plan.ts';
import { AttachedRuns, awaitTracked } from './runs/attached.ts';
import { defaultOutputLimits } from './runs/output-tar.ts';
import type { Preflight } from './checks/preflight.ts';
import { startCanaries } from './checks/canaries.ts';
import { NetworkCheck } from './checks/network-check.ts';

/** Constructor options of {@link createKubernetesRuntime}. */
export interface KubernetesRuntimeOptions {
  /** Client configuration; default `KubeConfig.loadFromDefault()` (in-cluster service account or `KUBECONFIG`). */
  kubeConfig?: KubeConfig;
  /** This replica's name in leader election (default: POD_NAME, else host and pid). */
  identity?: string;
  /** Needed by `start()` to garbage-collect Jobs whose record is terminal or missing. */
  hooks?: RuntimeHooks;
  clock?: Clock;
  logger?: Logger;
  /** The JobTypes there are now: the warm pool keeps pods for each (pool.ts). Without it: no pool. */
  jobTypes?: () => JobType[];
  /** Text of the runner shipped to every run; default: `src/sandbox/runner.py` read at creation. */
  runnerSource?: string;
  /** Text of the collector of attach pods; default: `src/sandbox/deliver.py` read at first use. */
  deliverSource?: string;
  /** Tuning, mostly for tests. */
  tuning?: {
    podGoneGraceMs?: number;
    execTimeoutMs?: number;
    collectAttempts?: number;
    informerBackoffInitialMs?: number;
    informerBackoffMaxMs?: number;
    watchTimeoutSeconds?: number;
    /** How long the preflight canary may take before it is inconclusive, ms. */
    preflightTimeoutMs?: number;
    /** How long the network canary tries again while its connection fails (refused or timed out), s. */
    networkCheckRetrySec?: number;
    /** Deadline of each API call, ms (default: `kubernetes.api_timeout_seconds`). */
    requestTimeoutMs?: number;
    /** How long health facts and the RuntimeClass lookup are cached, ms. */
    healthCacheMs?: number;
    /** How often a build watches its pod, ms. */
    buildPollMs?: number;
    /** How often the leader sweeps orphaned run Jobs, ms (leadership.ts). */
    sweepIntervalMs?: number;
    /** How often the warm pool is reconciled without an event, ms. */
    poolIntervalMs?: number;
    /** How long a claimed pool pod's refill may wait for its run, ms (pool.ts REFILL_DELAY_MS). */
    poolRefillDelayMs?: number;
    /** How long a program may take to start once handed to an attach pod, ms (runs/attached.ts). */
    handOverTimeoutMs?: number;
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
  private readonly sources: RunnerSources;
  private readonly attached: AttachedRuns;
  private readonly egress: EgressCredentials;
  private readonly runtimeClass: RuntimeClassLookup;
  private healthCache: { value: RuntimeHealth; at: number } | null = null;
  private started = false;
  private preflight: Preflight | null = null;
  private networkCheck: NetworkCheck | null = null;
  /** Job-type builds (builder.ts); present when `kubernetes.build_registry` is set. */
  readonly builder?: Builder;
  private pool: WarmPool | null = null;
  private leader: Leadership | null = null;
  private readonly earlierDeps: EarlierJobDeps;
  private readonly sessions: KubeSessions;

  constructor(
    private readonly config: Config,
    private readonly options: KubernetesRuntimeOptions,
  ) {
    this.kc = options.kubeConfig ?? defaultKubeConfig();
    this.clock = options.clock ?? systemClock;
    this.log = options.logger ?? silentLogger;
    this.ns = config.kubernetes.runs_namespace;
    const t = options.tuning ?? {};
    const requestTimeoutMs = t.requestTimeoutMs ?? config.kubernetes.api_timeout_seconds * 1000;
    this.api = new KubeApi(this.kc, { requestTimeoutMs });
    this.sources = new RunnerSources({ api: this.api, namespace: this.ns, instance: config.kubernetes.instance, clock: this.clock, log: this.log, ...(options.runnerSource !== undefined ? { runner: options.runnerSource } : {}), ...(options.deliverSource !== undefined ? { deliver: options.deliverSource } : {}) });
    this.egress = new EgressCredentials(config, this.clock, this.log);
    this.runtimeClass = new RuntimeClassLookup({ api: this.api, config, clock: this.clock, log: this.log, ...(t.healthCacheMs !== undefined ? { cacheMs: t.healthCacheMs } : {}) });
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
      watchTimeoutSeconds: t.watchTimeoutSeconds ?? config.kubernetes.watch_timeout_seconds,
      requestTimeoutMs,
    });
    this.attached = new AttachedRuns({
      api: this.api,
      controller: this.controller,
      pool: () => this.pool,
      config,
      clock: this.clock,
      log: this.log,
      sources: this.sources,
      egress: this.egress,
      ensureJob: (job, jobName) => ensureJob(this.api, this.ns, job, jobName),
      ...(t.podGoneGraceMs !== undefined ? { podGoneGraceMs: t.podGoneGraceMs } : {}),
      ...(t.handOverTimeoutMs !== undefined ? { handOverTimeoutMs: t.handOverTimeoutMs } : {}),
    });
    this.sessions = new KubeSessions({ api: this.api, config, pods: this.controller.pods, jobs: this.controller.jobs, clock: this.clock, log: this.log, runtimeClassName: () => this.runtimeClass.forRun(), sources: this.sources, egress: this.egress });
    this.earlierDeps = { api: this.api, controller: this.controller, attached: this.attached, ns: this.ns, instance: config.kubernetes.instance, log: this.log };
    if (config.kubernetes.build_registry) {
      this.builder = new KubernetesBuilder({
        config,
        api: this.api,
        pods: () => this.controller.pods.list(),
        jobs: () => this.controller.jobs.list(),
        runtimeClass: () => this.runtimeClass.forRun(),
        runnerSource: () => this.runner(),
        clock: this.clock,
        logger: this.log,
        workDir: path.join(config.workspace, 'kubernetes-builds'),
        // JobTypes from resources get Building/Ready/Failed conditions and the image digest.
        reportStatus: async (jobType, update) => {
          if (!config.kubernetes.watch_job_types) return;
          await patchJobTypeStatus(this.api, config.kubernetes.namespace, jobType, update, new Date(this.clock.now()));
        },
        ...(t.buildPollMs !== undefined ? { pollMs: t.buildPollMs } : {}),
      });
    }
  }

  /** Informers, request counters etc. for tests and the bench. */
  get internals(): { controller: RunController; api: KubeApi; pool: WarmPool | null } {
    return { controller: this.controller, api: this.api, pool: this.pool };
  }

  warmPoolStats = (): WarmPoolStats[] => this.pool?.stats() ?? [];
  sessionPoolStats = (): SessionPoolStats[] => this.sessions.poolStats();

  async start(): Promise<void> {
    if (this.started) return;
    this.runner();
    await this.controller.start();
    this.started = true;
    await this.runtimeClass.refresh();
    // The orphan sweep and the pool's creates and removals are the leader's (leadership.ts).
    this.leader = new Leadership({
      api: this.api,
      config: this.config,
      clock: this.clock,
      log: this.log,
      sweep: () => this.collectGarbage(),
      ...(this.options.identity !== undefined ? { identity: this.options.identity } : {}),
      ...(this.options.tuning?.sweepIntervalMs !== undefined ? { sweepIntervalMs: this.options.tuning.sweepIntervalMs } : {}),
      onChange: () => {
        this.healthCache = null;
        void this.pool?.kick();
        this.sessions.kickPool();
      },
    });
    await this.leader.start();
    if (this.options.jobTypes) {
      const jobTypes = this.options.jobTypes;
      this.pool = new WarmPool({
        api: this.api,
        controller: this.controller,
        config: this.config,
        clock: this.clock,
        log: this.log,
        jobTypes,
        runtimeClassName: () => this.runtimeClass.forRun(),
        sources: this.sources,
        leading: () => this.leader?.leading ?? true,
        ...(this.options.tuning?.poolIntervalMs !== undefined ? { intervalMs: this.options.tuning.poolIntervalMs } : {}),
        ...(this.options.tuning?.poolRefillDelayMs !== undefined ? { refillDelayMs: this.options.tuning.poolRefillDelayMs } : {}),
      });
      this.pool.start();
      this.sessions.startPool(jobTypes, () => this.leader?.leading ?? true, this.options.tuning?.poolIntervalMs);
    }
    if (this.config.kubernetes.preflight) await this.startPreflight();
  }

  /** The canaries run beside the service; their verdicts show in health() (checks/canaries.ts). */
  private async startPreflight(): Promise<void> {
    const t = this.options.tuning ?? {};
    const { preflight, networkCheck } = await startCanaries({
      api: this.api,
      config: this.config,
      clock: this.clock,
      log: this.log,
      pods: () => this.controller.pods.list(),
      runtimeClassName: () => this.runtimeClass.forRun(),
      onVerdict: () => {
        this.healthCache = null;
      },
      ...(t.preflightTimeoutMs !== undefined ? { timeoutMs: t.preflightTimeoutMs } : {}),
      ...(t.networkCheckRetrySec !== undefined ? { networkCheckRetrySec: t.networkCheckRetrySec } : {}),
    });
    this.preflight = preflight;
    this.networkCheck = networkCheck;
  }

  async stepDown(): Promise<void> {
    await this.leader?.stop();
  }

  /** This replica's part in leader election (`/health`, `/metrics`). */
  leadership(): LeadershipStatus {
    return this.leader?.status() ?? { enabled: false, identity: '', leading: false, holder: '', lease: null };
  }

  async stop(): Promise<void> {
    await this.leader?.stop();
    this.preflight?.stop();
    this.networkCheck?.stop();
    this.pool?.stop();
    this.sessions.stopPool();
    this.controller.stop();
    this.started = false;
  }

  async health(): Promise<RuntimeHealth> {
    const ttl = this.options.tuning?.healthCacheMs ?? 5000;
    const now = this.clock.now();
    if (this.healthCache && now - this.healthCache.at < ttl) return this.healthCache.value;
    const value = await runtimeHealth({ api: this.api, config: this.config, runtimeClass: this.runtimeClass, controller: this.controller, preflight: this.preflight, networkCheck: this.networkCheck, leadership: this.leadership() });
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
    // An earlier holder's Job of this execution, if any (runs/earlier-job.ts): re-attached, never doubled.
    let adopted = await earlierJob(this.earlierDeps, spec.executionId, key, jobName, options.adopt ?? false, () => assertHeld(options, "removing an earlier attempt's Job"), options.earlierAttempts ?? false);
    // Adopting creates nothing but a missing Secret, whose contents do not depend on the RuntimeClass.
    const runtimeClassName = adopted ? await this.runtimeClass.forRun().catch(() => null) : await this.runtimeClass.forRun();

    if (adopted) {
      startedAt = toMs(adopted.metadata?.creationTimestamp) ?? startedAt;
      jobSeen = true;
    } else {
      if (options.signal?.aborted && options.signal.reason !== 'fenced') return cancelledBeforeStart(startedAt);
      if (runtimeClassName === false) {
        return infraFailure(startedAt, 'config_error', `security_mode strict requires RuntimeClass ${this.config.kubernetes.runtime_class}, which does not exist in the cluster`);
      }
      // Input files travel in the run's Secret only: a run with any starts as a cold Job.
      const viaSecret = (spec.inputFiles?.length ?? 0) > 0;
      const warm = viaSecret ? null : await this.attached.runWarm(spec, options, key, startedAt);
      if (warm && 'observation' in warm) return warm;
      adopted = warm; // a Job: the program started there although its hand-over failed; followed below
      [jobSeen, startedAt] = adopted ? [true, startedAt] : [false, this.clock.now()];
      if (!adopted && !viaSecret && this.config.kubernetes.cold_start === 'attach' && poolable(spec.jobType, spec.requirements)) return this.attached.runColdAttach(spec, options, key, startedAt, runtimeClassName);
    }

    // Built only now: a warm or cold-attach run needs neither.
    const { secret, job } = buildJob(spec, spec.jobType, this.config, {
      runtimeClassName: runtimeClassName === false ? null : runtimeClassName,
      sources: this.sources.name(),
      egressProxy: await this.egress.forJob(spec),
    });
    const trackedJobName = adopted?.metadata?.name ?? jobName;
    // Tracked before anything is created: the controller then hears of every event of the run's
    // objects, even a pod that comes and goes before the creates return.
    const tracked = this.controller.track(key, {
      state: newRunState({
        executionId: spec.executionId,
        jobName: trackedJobName,
        startedAt,
        startupTimeoutMs: spec.startupTimeoutSec * 1000,
        podGoneGraceMs: t.podGoneGraceMs ?? 3000,
        jobSeen,
      }),
      limits: defaultOutputLimits(spec.maxArtifactBytes, spec.maxStdoutBytes),
      ...(options.onPhase ? { onPhase: options.onPhase } : {}),
      ...(options.onOutput ? { onOutput: options.onOutput } : {}),
      holdRelease: options.holdRelease === true,
      ...(adopted?.metadata?.uid ? { jobUid: adopted.metadata.uid } : {}),
    });
    // Awaited below; until then a rejection (runtime stopped) must not count as unhandled.
    tracked.catch(() => undefined);
    try {
      if (adopted) {
        const finished = adopted.status?.conditions?.some((c) => (c.type === 'Complete' || c.type === 'Failed') && c.status === 'True');
        // The process that created the Job may have died before its Secret existed.
        // A claimed pool pod has no Secret: its program came through attach.
        if (!finished && !adopted.metadata?.labels?.[POOL_LABELS.pool]) await ensureSecret(this.api, this.ns, secretForJob(secret, adopted, () => this.runner()), adopted);
      } else {
        await this.sources.ensure(); // the pod mounts the runner from it
        await assertHeld(options, 'creating its Job');
        const owner = await ensureJob(this.api, this.ns, job, jobName);
        // From now on the controller takes only this Job and its pods as the run's: a Job of the
        // same name from an earlier attempt, and its pod, may still be terminating.
        this.controller.ownJob(key, owner.metadata?.uid ?? '');
        try {
          await ensureSecret(this.api, this.ns, secret, owner);
        } catch (err) {
          // Without its Secret the pod can never start; remove the Job so a retry starts clean.
          await this.api.deleteJob(this.ns, jobName, owner.metadata?.uid).catch(() => undefined);
          throw err;
        }
      }
    } catch (err) {
      this.controller.untrack(key);
      throw err;
    }

    // Cancellation is heard only now: a cancel during the creates would delete a Job not yet made.
    return awaitTracked(this.controller, key, tracked, options);
  }

  /** A session's own pod (session/sessions.ts). */
  openSession(jobType: JobType, o: SessionOpenOptions): Promise<SessionSandbox> {
    return this.started ? this.sessions.open(jobType, o) : Promise.reject(new Error('kubernetes runtime: start() was not called'));
  }
  /** The live pod of a session another process held (a restarted replica), or null. */
  adoptSession = (sessionId: string): Promise<SessionSandbox | null> => this.sessions.adopt(sessionId);

  /** The runner text (read once). */
  private runner(): string {
    return this.sources.runner();
  }

  /** Deletes Jobs of this instance whose execution is terminal or unknown (SPEC §1.12), and those of ended sessions. */
  private async collectGarbage(): Promise<void> {
    if (this.options.hooks) await collectGarbage(this.api, this.ns, this.controller.jobs.list(), this.options.hooks, this.log);
    if (this.options.hooks?.liveSessionIds) await this.sessions.collectGarbage(this.controller.jobs.list(), this.options.hooks.liveSessionIds);
    await this.sources.collectGarbage(this.controller.jobs.list()).catch((err: unknown) => this.log.warn({ err }, 'could not remove unused runner sources ConfigMaps'));
  }
}

const cancelledBeforeStart = (startedAt: number): RawRun => emptyRun(baseObservation(startedAt, { cancelled: true }));
const infraFailure = (startedAt: number, type: string, message: string): RawRun => emptyRun(baseObservation(startedAt, { infraError: { type, message } }));
