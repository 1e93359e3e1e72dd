/**
 * The cluster warm pool's Jobs (issue 10), pure: the pool Job a JobType's idle pods come from, and what
 * a claim changes on it and its pod. The pool's decisions are in pool-decide.ts; pool.ts applies both.
 *
 * A pool Job is a run Job (build-job.ts) with no execution yet, and `main`'s mounts are the run Job's
 * own: /code and /input read-only (SPEC §1.5), here emptyDirs instead of the run's Secret. Who writes
 * them is the `collector`, the only container that mounts them writable and that runs nothing of the
 * user's: it runs deliver.py with stdin attached (`stdin`, `stdinOnce`), so the program and its input
 * arrive there by attach and are written before the runner hears of them. `main` runs the runner in
 * `--wait --go-port` mode: it holds a loopback port from its start (before any program exists), and
 * the collector connects to it once the files are written and sends the go line; the runner's phase
 * lines (`ready`, `execution`, `done N`) go back on that connection, through the collector's stdout
 * to the attached service. The program cannot forge them (its stdout is a pipe to the runner) and
 * `main`'s own stdout and stderr carry, with `--tee`, only the program's output, as in a cold pod
 * (`kubectl logs -c main`). Runner and delivery script come from a ConfigMap mounted read-only at
 * `/sandpod` in both containers (runs/runner-sources.ts); the pod mounts no Secret at all.
 */
import { createHash } from 'node:crypto';
import type { V1Container, V1Job } from '@kubernetes/client-node';
import { jobRef, type JobType } from '../../../jobtypes/job-type.ts';
import type { RunSpec } from '../../runtime.ts';
import { SECRET_KEYS, buildJob, builtImage, extraRequirements, jobDeadlineSeconds, type BuildJobConfig } from '../runs/build-job.ts';
import { ANNOTATIONS, CLAIM_FILE, CONTAINERS, LABELS, RELEASE_FILE, executionLabel } from '../names.ts';
import { toMs } from '../runs/decide.ts';
import { SOURCES_DIR, SOURCE_FILES, sourcesMount } from '../runs/runner-sources.ts';

/**
 * Whether runs of a JobType can come from a pool pod (or a cold attach pod): every run that installs
 * nothing at run time (pool pods have no `deps`). A built type's pods run its built image by digest,
 * so its own requirements are there; only requirements a run adds beyond them need a cold pod. An
 * `allowed_hosts` type is pooled too: the run's proxy credential reaches the runner on the go line at
 * the claim (hand-over.ts), never in the pod spec.
 */
export function poolable(jobType: JobType, requirements: readonly string[] = jobType.requirements): boolean {
  const toInstall = builtImage(jobType) !== null ? extraRequirements(requirements, jobType.requirements) : requirements;
  return toInstall.length === 0;
}

/** Labels only pool Jobs (and their pods) carry. */
export const POOL_LABELS = {
  /** The JobType the pod waits for. */
  pool: 'sandpod.io/warm-pool',
  /** Hash of the pod template: a JobType (or runner, or config) change makes idle pods stale. */
  specHash: 'sandpod.io/pool-spec',
} as const;

/** Annotation a claim puts on a pool Job: when it was claimed (epoch ms), which defers its refill. */
export const CLAIMED_AT = 'sandpod.io/claimed-at';

/** Room for the program and its input in a pool pod's emptyDirs. */
const DELIVERY_VOLUME_LIMIT = '64Mi';
/** How long an unclaimed pool Job may live past its idle limit before the Job controller ends it. */
const POOL_DEADLINE_SLACK_SEC = 600;

/** Inputs of {@link buildPoolJob}. */
export interface PoolJobOptions {
  runtimeClassName: string | null;
  /** The ConfigMap the runner and deliver.py (the collector's script) are mounted from (runner-sources.ts). */
  sources: string;
  /** The Job's name (random, from the pool). */
  name: string;
  maxIdleSec: number;
}

/** The loopback port `main`'s runner takes the go line on from the collector (runner.py `--go-port`). */
export const GO_PORT = 7719;

/**
 * The port `main`'s runner says it is ready on (runner `--ready-listen`), on the pod's own IP: it
 * listens there once its go port is held and its preloads are imported, and accepts and closes
 * whatever connects. `main`'s startup probe is a `tcpSocket` probe of it, so the kubelet reports
 * `main` not ready until then, and nothing is exec'd into the sandbox to find out (under gVisor an
 * exec'd probe could not always read the container's /tmp). Isolation: the runner opens it after the
 * program's process was forked, close-on-exec, and closes it when the go connection comes, before the
 * program exists: the program never holds it, and no run can answer a later probe. A pod counted ready
 * when its container merely ran could be handed a program before its runner listened, and a preloading
 * pod would make the program wait for its imports.
 */
export const READY_PORT = 7720;

/** The variable (downward API, `status.podIP`) `main`'s command names the ready address by; `env -i` drops it before the runner. */
export const POD_IP_ENV = 'SANDPOD_POD_IP';

/** `main`'s startup probe on pool pods: the ready port, tried every second for up to 10 minutes. */
const READY_PROBE = { tcpSocket: { port: READY_PORT }, periodSeconds: 1, timeoutSeconds: 5, failureThreshold: 600 };

/** Option names of the runner whose value the go line supplies (dropped from a pool pod's command). */
const PER_RUN_OPTIONS = new Set(['--timeout', '--max-stream-bytes']);

/**
 * The pool Job of a JobType, without the spec-hash label (see {@link poolJob}). Pure. Built from the
 * run Job of a placeholder run, so every change to run Jobs (security, limits, networking) reaches
 * pool pods too.
 */
function buildPoolJobBody(jobType: JobType, config: BuildJobConfig, opts: PoolJobOptions): V1Job {
  const placeholder: RunSpec = {
    executionId: 'pool',
    code: '',
    inputJson: '',
    jobType,
    timeoutSec: jobType.timeout,
    startupTimeoutSec: 0,
    requirements: [],
    maxStdoutBytes: 0,
    maxArtifactBytes: 0,
  };
  const { job } = buildJob(placeholder, jobType, config, { runtimeClassName: opts.runtimeClassName, sources: opts.sources, egressAtClaim: true });
  const tpl = job.spec!.template;
  const podSpec = tpl.spec!;
  const strip = (m: Record<string, string> | undefined, keys: string[]) => Object.fromEntries(Object.entries(m ?? {}).filter(([k]) => !keys.includes(k)));
  const labels = { ...strip(job.metadata?.labels, [LABELS.executionId]), [POOL_LABELS.pool]: jobType.name };
  const annotations = { [ANNOTATIONS.jobRef]: jobRef(jobType) };
  const main = podSpec.containers.find((c) => c.name === CONTAINERS.main)!;
  const collector = podSpec.containers.find((c) => c.name === CONTAINERS.collector)!;
  const cmd = main.command ?? [];
  // `... python3 /sandpod/runner.py <args>` → the same script, with the args but the per-run ones.
  const at = cmd.indexOf('/sandpod/runner.py');
  const head = cmd.slice(0, at);
  const args: string[] = [];
  for (let i = at + 1; i < cmd.length; i++) {
    const a = cmd[i]!;
    if (PER_RUN_OPTIONS.has(a)) i++;
    else args.push(a);
  }
  // The type's `preload` modules are imported by the held program process before the go line (a
  // module that fails there is skipped; the program then gets the real error).
  const preload = jobType.preload.length > 0 ? ['--preload', jobType.preload.join(',')] : [];
  const command = [...head, `${SOURCES_DIR}/${SOURCE_FILES.runner}`, ...args, '--wait', '--go-port', String(GO_PORT), ...preload, '--ready-listen', `$(${POD_IP_ENV}):${READY_PORT}`];
  // main keeps the run Job's mounts (code and input read-only), the runner's (`runner`, /sandpod) from
  // the sources ConfigMap instead of the run's Secret; the collector mounts it too.
  const mounts = main.volumeMounts ?? [];
  const collectorMounts = [...(collector.volumeMounts ?? []), { name: 'code', mountPath: '/code' }, { name: 'input', mountPath: '/input' }, sourcesMount()];
  // The collector's image is the executor image, which has python3 (it is the default for main).
  // `-S`: deliver.py needs nothing but the standard library, so no `site` (and its .pth files) at start.
  const collectorCommand = [
    ...head.slice(0, head.indexOf('python3')),
    'python3',
    '-S',
    `${SOURCES_DIR}/${SOURCE_FILES.deliver}`,
    '--code',
    `/code/${SECRET_KEYS.code}`,
    '--input',
    `/input/${SECRET_KEYS.input}`,
    '--go-port',
    String(GO_PORT),
    '--release',
    RELEASE_FILE,
    '--claim',
    CLAIM_FILE,
    // The outputs go back on the attach before `done` (deliver.py), which saves an exec per run.
    '--output',
    '/output',
  ];
  const volumes = (podSpec.volumes ?? []).map((v) => (v.name === 'code' || v.name === 'input' ? { name: v.name, emptyDir: { sizeLimit: DELIVERY_VOLUME_LIMIT } } : v));
  // main first: the kubelet starts a pod's containers one after the other, in order, and main's
  // runner (an interpreter start under gVisor, about a second on a busy node) is the long pole of a
  // cold attach run; the collector is started, attached to and handed the program meanwhile (with the
  // collector first, kcluster showed main's runner ready 1.0-1.5 s after the attach).
  // The pod IP is for main's ready listener: the kubelet expands `$(SANDPOD_POD_IP)` in the command.
  const mainEnv = [...(main.env ?? []), { name: POD_IP_ENV, valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } }];
  const containers = podSpec.containers.map((c) => {
    if (c.name === CONTAINERS.main) return { ...main, command, env: mainEnv, volumeMounts: mounts, startupProbe: READY_PROBE };
    if (c.name === CONTAINERS.collector) return { ...collector, command: collectorCommand, volumeMounts: collectorMounts, stdin: true, stdinOnce: true };
    return c;
  });
  return {
    ...job,
    metadata: { name: opts.name, namespace: job.metadata?.namespace ?? '', labels: { ...labels }, annotations: { ...annotations } },
    spec: {
      ...job.spec!,
      activeDeadlineSeconds: opts.maxIdleSec + POOL_DEADLINE_SLACK_SEC,
      template: {
        metadata: { labels: { ...labels }, annotations: { ...annotations } },
        spec: {
          ...podSpec,
          containers,
          volumes,
        },
      },
    },
  };
}

/** The hash of what makes a pool pod (the template, with names left out). */
export function poolSpecHash(job: V1Job): string {
  return createHash('sha256').update(JSON.stringify(job.spec?.template ?? {})).digest('hex').slice(0, 16);
}

/** The pool Job of a JobType, labelled with its spec hash. Pure. */
export function poolJob(jobType: JobType, config: BuildJobConfig, opts: PoolJobOptions): { job: V1Job; specHash: string } {
  const job = buildPoolJobBody(jobType, config, opts);
  const specHash = poolSpecHash(buildPoolJobBody(jobType, config, { ...opts, name: 'x' }));
  job.metadata!.labels![POOL_LABELS.specHash] = specHash;
  job.spec!.template.metadata!.labels![POOL_LABELS.specHash] = specHash;
  return { job, specHash };
}

/** What a claim writes onto a pool Job and its pod: the run's labels and annotations. */
export function claimMetadata(spec: Pick<RunSpec, 'executionId' | 'timeoutSec' | 'startupTimeoutSec'>): { labels: Record<string, string>; annotations: Record<string, string> } {
  return {
    labels: { [LABELS.executionId]: executionLabel(spec.executionId) },
    annotations: {
      [ANNOTATIONS.executionId]: spec.executionId,
      [ANNOTATIONS.timeout]: String(spec.timeoutSec),
      [ANNOTATIONS.startupTimeout]: String(spec.startupTimeoutSec),
    },
  };
}

/** An RFC 6901 path segment. */
function pointer(key: string): string {
  return key.replace(/~/g, '~0').replace(/\//g, '~1');
}

/**
 * The claim of a pool Job, as a JSON patch: the run's labels and annotations, the claim's time
 * ({@link CLAIMED_AT}), and a deadline counted from now (the Job's `activeDeadlineSeconds` counts from
 * its start): its age + the run's limits + grace. It sets `metadata.resourceVersion` to the version the
 * Job was read at, which the API server takes as a precondition (409 when another replica claimed it
 * first), so the claim writes a few hundred bytes instead of the whole Job as an update would.
 */
export function claimJobPatch(job: V1Job, spec: Pick<RunSpec, 'executionId' | 'timeoutSec' | 'startupTimeoutSec'>, graceSec: number, now: number): object[] {
  const meta = claimMetadata(spec);
  const started = toMs(job.status?.startTime) ?? toMs(job.metadata?.creationTimestamp) ?? now;
  const ageSec = Math.max(0, Math.ceil((now - started) / 1000));
  return [
    { op: 'replace', path: '/metadata/resourceVersion', value: job.metadata?.resourceVersion ?? '' },
    ...Object.entries(meta.labels).map(([k, value]) => ({ op: 'add', path: `/metadata/labels/${pointer(k)}`, value })),
    ...Object.entries({ ...meta.annotations, [CLAIMED_AT]: String(now) }).map(([k, value]) => ({ op: 'add', path: `/metadata/annotations/${pointer(k)}`, value })),
    { op: 'replace', path: '/spec/activeDeadlineSeconds', value: ageSec + jobDeadlineSeconds({ ...spec, startupTimeoutSec: 0 }, graceSec) },
  ];
}

/**
 * The Job of a cold run started the way a warm one runs (`kubernetes.cold_start: attach`): a pool
 * Job named after the execution, carrying its labels from the start, with the run's deadline. Pure.
 */
export function coldAttachJob(spec: RunSpec, config: BuildJobConfig, opts: Omit<PoolJobOptions, 'name' | 'maxIdleSec'> & { name: string; graceSec: number }): V1Job {
  const { job } = poolJob(spec.jobType, config, { ...opts, maxIdleSec: 0 });
  const meta = claimMetadata(spec);
  const labels = { ...job.metadata!.labels!, ...meta.labels };
  const annotations = { ...job.metadata!.annotations!, ...meta.annotations };
  return {
    ...job,
    metadata: { ...job.metadata!, labels, annotations },
    spec: {
      ...job.spec!,
      activeDeadlineSeconds: jobDeadlineSeconds(spec, opts.graceSec),
      template: {
        ...job.spec!.template,
        metadata: { labels: { ...labels }, annotations: { ...annotations } },
        // Its program comes as soon as the collector runs: no readiness to wait for (no probe, no ready
        // port); the collector waits for `main`'s runner up to the run's startup limit (not 60 s).
        spec: { ...job.spec!.template.spec!, containers: job.spec!.template.spec!.containers.map((c) => withConnectTimeout(withoutReadiness(c), spec.startupTimeoutSec)) },
      },
    },
  };
}

/** The collector waits for `main`'s runner up to `sec` (deliver.py `--connect-timeout`). */
function withConnectTimeout(c: V1Container, sec: number): V1Container {
  return c.name === CONTAINERS.collector && sec > 0 ? { ...c, command: [...(c.command ?? []), '--connect-timeout', String(sec)] } : c;
}

/** A pool pod's container without what tells its readiness (the startup probe, `--ready-listen` and the pod IP variable). */
function withoutReadiness({ startupProbe: _probe, ...c }: V1Container): V1Container {
  if (c.name !== CONTAINERS.main) return c;
  const at = c.command?.indexOf('--ready-listen') ?? -1;
  const command = at < 0 ? c.command : [...c.command!.slice(0, at), ...c.command!.slice(at + 2)];
  const env = (c.env ?? []).filter((e) => e.name !== POD_IP_ENV);
  const { env: _env, ...rest } = c;
  return { ...rest, command, ...(env.length > 0 ? { env } : {}) };
}

/** JSON patch of a claimed pod's labels and annotations (both maps exist on pool pods). */
export function claimPodPatch(spec: Pick<RunSpec, 'executionId' | 'timeoutSec' | 'startupTimeoutSec'>): object[] {
  const meta = claimMetadata(spec);
  return [
    ...Object.entries(meta.labels).map(([k, value]) => ({ op: 'add', path: `/metadata/labels/${pointer(k)}`, value })),
    ...Object.entries(meta.annotations).map(([k, value]) => ({ op: 'add', path: `/metadata/annotations/${pointer(k)}`, value })),
  ];
}
