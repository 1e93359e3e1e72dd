/**
 * The contract between the service and every runtime (local engines, Kubernetes).
 *
 * A runtime receives a {@link RunSpec}, runs `src/sandbox/runner.py` inside a sandbox with the file
 * layout of SPEC §1.5, and reports a {@link RawRun}: what it observed itself (trusted) next to what the
 * runner reported (untrusted — user code runs with the runner's uid and can forge it). It never decides
 * the record's status: `executions/classify.ts` does that, the same way for every runtime.
 */
import type { BuiltEnvironment, JobType } from '../jobtypes/job-type.ts';
import type { SessionOpenOptions, SessionPoolStats, SessionSandbox } from './session.ts';

export type { BuiltEnvironment, LockedRequirement } from '../jobtypes/job-type.ts';

/** Everything a runtime needs to start one run. */
export interface RunSpec {
  executionId: string;
  code: string;
  /** `input_data` already serialized; written to `/input/data.json`. */
  inputJson: string;
  /** Files placed read-only under `/input/files/` (plain names, checked at submission); absent when none. */
  inputFiles?: { name: string; data: Buffer; sha256: string }[];
  jobType: JobType;
  /** Execution time limit, seconds (excludes startup). */
  timeoutSec: number;
  /** Startup time limit (sandbox creation + dependency install), seconds. */
  startupTimeoutSec: number;
  /**
   * The W3C traceparent the program sees as `TRACEPARENT` (the run's span), so user code that uses
   * OpenTelemetry continues the run's trace. Absent: no trace.
   */
  traceparent?: string;
  /** Requirements to install at run time: the job type's plus the request's, deduplicated. */
  requirements: string[];
  maxStdoutBytes: number;
  maxArtifactBytes: number;
}

/**
 * What only this run adds to the program's environment: its `TRACEPARENT` (the run's span), so user
 * code that uses OpenTelemetry continues the run's trace. Every path passes it: a cold run on the
 * runner's command line (and, locally, the sandbox's environment), a warm one in the go line.
 */
export function runEnv(spec: Pick<RunSpec, 'traceparent'>): Record<string, string> {
  return spec.traceparent ? { TRACEPARENT: spec.traceparent } : {};
}

/** The runner's report (`/output/.svc_report.json`). Untrusted: the user's code could have written it. */
export interface RunnerReport {
  phase?: string;
  exit_code?: number | null;
  signal?: number | null;
  /** Class name of the uncaught exception, e.g. `ModuleNotFoundError`. */
  exception?: string | null;
  /** Class names of the exception's MRO (most derived first), so subclasses classify like their base. */
  exception_mro?: string[] | null;
  /** For import errors: the module that was missing. */
  missing_module?: string | null;
  exception_message?: string | null;
  execution_ms?: number;
  max_rss_kb?: number;
  cpu_time_ms?: number;
  stdout_truncated?: boolean;
  stderr_truncated?: boolean;
  timed_out?: boolean;
}

/** What the runtime itself saw. Trusted. */
export interface RunObservation {
  /** Exit status of the sandbox's main process (the runner), null when it did not exit on its own. */
  exitCode: number | null;
  /** Set when the runtime's own deadline fired, with the phase it fired in. */
  timedOut: 'startup' | 'execution' | null;
  /** The kernel/cluster reported an OOM kill (cgroup `oom_kill` counter, `OOMKilled`). */
  oomKilled: boolean;
  /**
   * True when the runtime can tell OOM kills from other SIGKILLs (cgroups, Kubernetes). When false,
   * exit 137 is taken as `oom` (SPEC §7.2's table); when true, 137 without `oomKilled` is `killed`.
   */
  oomDetectable?: boolean;
  /** The run was stopped because it was cancelled. */
  cancelled: boolean;
  /** Dependency installation failed; message is pip's own output (tail). */
  dependencyError: string | null;
  /**
   * The machinery failed (engine missing, image not found, sandbox could not be created).
   * `type` is a SPEC §7.2 type such as `docker_error` or `internal_error`.
   */
  infraError: { type: string; message: string } | null;
  /** Phase reached, as far as the runtime knows (`startup` until the runner began user code). */
  phase: 'startup' | 'execution' | 'completed' | 'failed';
  startedAt: Date;
  endedAt: Date;
  /** Milliseconds of the startup phase (sandbox creation + dependency install). */
  startupMs: number;
  /** Milliseconds of dependency installation (part of startup); 0 when none or cached. */
  depInstallMs: number;
  /** Milliseconds of the execution phase as measured by the runtime. */
  executionMs: number;
  /** Total milliseconds of the run. */
  totalMs: number;
  /** Trusted resource usage when the runtime can measure it (cgroups); otherwise the report's. */
  maxRssMb?: number;
  cpuTimeMs?: number;
  /** The sandbox was a warm one claimed for this run (true) or started for it (false); absent when unknown. */
  warm?: boolean;
  /**
   * Steps the runtime observed on its own path, for the run's trace (Kubernetes: the Job create, the
   * scheduling wait, the attach), each timed from what it saw (API answers, pod conditions).
   */
  steps?: ObservedStep[];
}

/** One step of a run a runtime observed (a span of the run's trace, recorded after the fact). */
export interface ObservedStep {
  /** Span name, e.g. `sandpod.kube.schedule`. */
  name: string;
  start: Date;
  end: Date;
  attributes?: Record<string, string | number | boolean>;
}

/** A file collected from `/output`. */
export interface CollectedFile {
  name: string;
  size: number;
  sha256: string;
  contentType: string;
  /** Bytes, absent when the file was over `maxArtifactBytes` (then `skipped` says why). */
  data?: Buffer;
  skipped?: 'too_large' | 'reserved_name' | 'not_regular';
}

/** Everything a run produced. */
export interface RawRun {
  observation: RunObservation;
  report: RunnerReport | null;
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /** Contents of `/output/result.json` when present (text, not parsed; parsing is classify's job). */
  resultJson: string | null;
  /** True when result.json existed but was too large to keep. */
  resultJsonTooLarge?: boolean;
  /** At most `MAX_ARTIFACT_ENTRIES` of them (`run-output.ts`). */
  artifacts: CollectedFile[];
  /**
   * Entries the program left in `/output` (the runner's files and `result.json` aside), listed or
   * not; a lower bound when the collection stopped early. Absent: `artifacts.length`.
   */
  artifactsTotal?: number;
  /** Not every entry of `/output` is in `artifacts` (over the limit, or the collection stopped early). */
  artifactsTruncated?: boolean;
  /**
   * Given with {@link RunOptions.holdRelease}: the caller has written the run's record, so the sandbox
   * may let go of the outputs it still holds (a Kubernetes run pod's collector exits and the pod ends).
   */
  letGo?: () => void;
}

/** Health facts a runtime reports for `/health`. */
export interface RuntimeHealth {
  /** The engine can run sandboxes right now (SPEC's `docker_available`). */
  available: boolean;
  /** gVisor is installed/usable (SPEC's `gvisor_available`). */
  gvisorAvailable: boolean;
  /** Engine in use, e.g. `gvisor`, `bubblewrap`, `process`, `kubernetes`. */
  engine: string;
  /** False for the `process` engine: no isolation at all. */
  isolated: boolean;
  /** How limits are enforced: `cgroups`, `rlimits`, `kubernetes`. */
  limits: string;
  detail?: Record<string, unknown>;
  /** Why the engine, though available, cannot run programs as it should (e.g. a failed preflight): `/health` is degraded. */
  problems?: string[];
}

/** Options for one run. */
export interface RunOptions {
  /** Aborted on cancel or shutdown; the runtime stops the sandbox promptly and reports `cancelled`. */
  signal?: AbortSignal;
  /**
   * Called when the run moves from startup to execution (for the record's phase and crash safety);
   * runtimes that can tell also report `installing` when requirements start installing (part of startup).
   */
  onPhase?: (phase: 'startup' | 'installing' | 'execution') => void;
  /**
   * The program's output as it is written (`GET /jobs/{id}/events`), in order per stream, raw bytes.
   * Optional for a runtime and best effort: the record's stdout/stderr still come from the {@link RawRun}.
   * A runtime that only sees both streams merged (the Kubernetes container log) reports them as `stdout`.
   */
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Uint8Array) => void;
  /**
   * Re-attach to a run started by an earlier process (after a restart) instead of starting one.
   * Runtimes that cannot re-attach (local) reject with {@link RunGoneError}; so does a runtime whose
   * run left no trace (never created, or already garbage-collected).
   */
  adopt?: boolean;
  /**
   * Whether the run is still this process's (the service's holder lease and claim, queue/holders.ts):
   * asked before each step that would start the program (creating a Job, handing a program to a pod).
   * False: another process took the run over; the runtime starts nothing and rejects with
   * {@link FencedError}. An abort with reason `fenced` means the same once the run is under way: the
   * runtime lets go of it without stopping what the new holder re-attaches to (the Kubernetes Job), or
   * stops it where nobody can re-attach (a local sandbox).
   */
  confirmHeld?: () => Promise<boolean>;
  /**
   * The sandbox keeps the outputs until the caller calls the result's {@link RawRun.letGo} (its record
   * is written): a process that dies between the run's end and its record leaves them to whoever
   * adopts the run, instead of a pod whose outputs are gone. Runtimes whose sandboxes end with their
   * process ignore it.
   */
  holdRelease?: boolean;
  /**
   * An abort with reason `shutdown` (the service stops and gives the run back to the queue) lets go
   * of the run where its sandbox outlives this process (a Kubernetes Job): the Job is left running,
   * the run rejects with {@link LeftRunningError}, and the run's next holder re-attaches to it
   * instead of starting the program again. Without it (or where nothing outlives the process) such
   * an abort stops the run.
   */
  leaveOnShutdown?: boolean;
  /**
   * The record was claimed before (given back, e.g. by a replica that stopped and left its sandbox
   * running): a sandbox of an earlier attempt may exist that this process has not seen yet. A
   * runtime that re-attaches to such sandboxes asks its source of truth, not only its cache.
   */
  earlierAttempts?: boolean;
}

/** The service stopped and the run's sandbox was left running for its next holder ({@link RunOptions.leaveOnShutdown}). */
export class LeftRunningError extends Error {
  override readonly name = 'LeftRunningError';
}

/** Thrown by `run(..., { adopt: true })` when there is nothing to re-attach to. */
export class RunGoneError extends Error {
  override readonly name = 'RunGoneError';
  /** `neverStarted`: the runtime knows no program of the run started (none reached a sandbox), so it may start afresh. */
  constructor(message: string, readonly neverStarted = false) {
    super(message);
  }
}

/** The run was taken over by another process: this attempt stopped without starting or settling anything. */
export class FencedError extends Error {
  override readonly name = 'FencedError';
}

/** Rejects with {@link FencedError} unless the run is still ours (see {@link RunOptions.confirmHeld}). */
export async function assertHeld(options: RunOptions, what: string): Promise<void> {
  if (options.signal?.aborted && options.signal.reason === 'fenced') throw new FencedError(`the run was taken over by another process before ${what}`);
  if (options.confirmHeld && !(await options.confirmHeld())) throw new FencedError(`the run was taken over by another process before ${what}`);
}


/** What a runtime may ask of the service without knowing the store. */
export interface RuntimeHooks {
  /** Of the given execution ids, those whose record exists and is not terminal. */
  liveExecutionIds(ids: string[]): Promise<Set<string>>;
  /** Of the given session ids, those whose session exists and has not ended (a cluster's session pods). */
  liveSessionIds?(ids: string[]): Promise<Set<string>>;
}

/** A runtime: runs sandboxes and says how healthy it is. */
export interface Runtime {
  readonly name: string;
  /** Prepares the runtime (checks engines, removes orphans of earlier runs). */
  start(): Promise<void>;
  /** Stops background work; running sandboxes are left to the caller's cancellation. */
  stop(): Promise<void>;
  health(): Promise<RuntimeHealth>;
  /**
   * Runs one sandbox to completion. Resolves with what happened — including user failures, timeouts
   * and OOM. Rejects only when the machinery failed in a way worth retrying (engine unreachable).
   */
  run(spec: RunSpec, options?: RunOptions): Promise<RawRun>;
  /**
   * Optional: `run(spec)` follows as soon as the run's record is written. A runtime may get a sandbox
   * ready for it meanwhile (the local one claims a warm sandbox and writes the program into it);
   * nothing runs before `run`. {@link unreserve} gives back what `run` did not take.
   */
  reserve?(spec: RunSpec): void;
  /** Gives back a reservation `run` did not take (its record could not be written, the run was refused); no-op otherwise. */
  unreserve?(executionId: string): void;
  /** Builds job types into pinned environments (SPEC §4.9); absent where builds are not supported yet. */
  readonly builder?: Builder;
  /**
   * Sessions (issue 19): a sandbox for one session only, never reused, with a persistent interpreter.
   * Absent where the runtime has none; rejects when one cannot be started.
   */
  openSession?(jobType: JobType, o: SessionOpenOptions): Promise<SessionSandbox>;
  /**
   * Sessions whose sandbox outlives the service process (a cluster's pods): takes the live sandbox of
   * a session another process held back, or null when it is gone. Absent where sandboxes die with
   * their service (local: such sessions end `service_restart`).
   */
  adoptSession?(sessionId: string): Promise<SessionSandbox | null>;
  /** Warm sandbox pools per job type (runtimes that keep them; issue 10). */
  warmPoolStats?(): WarmPoolStats[];
  /** Ready session sandboxes per job type (issue 19; runtimes that keep them). */
  sessionPoolStats?(): SessionPoolStats[];
  /** Leader election among replicas (runtimes with cluster-wide loops; issue 20). */
  leadership?(): LeadershipStatus;
  /** At the start of a shutdown: gives up cluster-wide duties (releases the leader Lease); runs in flight go on. */
  stepDown?(): Promise<void>;
}

/** Whether this replica runs the cluster-wide loops (`/health`, `/metrics`). */
export interface LeadershipStatus {
  /** False: no election (one replica), this one always leads. */
  enabled: boolean;
  identity: string;
  leading: boolean;
  /** The Lease's holder as last seen ('' when released or not read yet). */
  holder: string;
  /** `namespace/name` of the Lease; null without election. */
  lease: string | null;
}

/** A build's progress, as a builder reports it (`resolving`, `installing`, `publishing`…). */
export type BuildProgress = (phase: string, detail?: string) => void;

/** What a build is asked to do. */
export interface BuildRequest {
  jobType: JobType;
  /** Requirements to resolve (the job type's). */
  requirements: string[];
  onProgress: BuildProgress;
  /** Bounds the build (epoch ms). */
  deadline: number;
  signal?: AbortSignal;
}

/** A build that could not be done; `message` is the builder's (pip's output tail, a registry error). */
export class BuildFailedError extends Error {
  override readonly name = 'BuildFailedError';
}

/**
 * Builds job types for one runtime. The local builder installs into a content-addressed read-only
 * directory; a cluster builder would run a build Job and push an image layer by digest. The service
 * (jobtypes/builds.ts) owns single-flight, the build records and pinning; a builder only builds.
 */
export interface Builder {
  /**
   * A key of everything the build's *inputs* depend on besides the requirements (interpreter or base
   * image, pip settings): a built environment applies to a job type while this and the requirements
   * are unchanged.
   */
  inputKey(jobType: JobType, requirements: readonly string[]): string;
  /** Resolves and installs; throws {@link BuildFailedError} with the builder's message. */
  build(req: BuildRequest): Promise<BuiltEnvironment>;
  /**
   * Makes an environment built elsewhere (another replica) present here, installing exactly its lock
   * when it is missing. Resolves when it is usable.
   */
  materialize(env: BuiltEnvironment, deadline: number, signal?: AbortSignal): Promise<void>;
  /** True when the environment is present here (nothing to install before a run). */
  has(env: BuiltEnvironment): boolean;
}

/** One job type's warm sandboxes, as `/pool/stats` and `/metrics` show them. */
export interface WarmPoolStats {
  job_type: string;
  /** Configured number of waiting sandboxes. */
  target: number;
  ready: number;
  starting: number;
  /** Ages of the oldest and newest ready sandbox (ms since their start), null when none is ready. */
  oldest_age_ms: number | null;
  newest_age_ms: number | null;
  /** Runs that got a warm sandbox, and runs of a pooled job type that started cold. */
  hits: number;
  misses: number;
  /**
   * Mean time from a warm sandbox's start to its readiness (ms; the slowest of the job type's pool
   * keys), null before one was measured; absent where not measured.
   */
  refill_ms?: number | null;
  /**
   * Warm sandboxes restored from a checkpoint rather than booted (local gVisor with
   * `warm_pool.restore`), since the start; absent where sandboxes are never restored.
   */
  restored?: number;
  /**
   * Hand-overs to a claimed warm sandbox that failed before the program started, after which the run
   * was tried again (another warm sandbox, or cold). In `/metrics` only; absent where not counted.
   */
  handover_retries?: number;
}
