/**
 * The pure builder of a run's Kubernetes objects: a Secret with the code and the input, and a
 * batch/v1 Job whose pod runs `deps` (init, optional), `main` (the runner) and `collector`. The
 * runner comes from the runner sources ConfigMap (runs/runner-sources.ts), mounted at /sandpod.
 * Only fields that exist in Kubernetes 1.20 are used (no `suspend`, `podFailurePolicy`, ...).
 */
import type { V1Job, V1Secret, V1Container, V1Volume, V1SecurityContext, V1PodSecurityContext, V1PodSpec } from '@kubernetes/client-node';
import { parseMemory, type Config } from '../../../config.ts';
import { jobRef, type JobType } from '../../../jobtypes/job-type.ts';
import { egressProxyUrl } from '../../../egress/token.ts';
import { runEnv, type RunSpec } from '../../runtime.ts';
import { BUILT_SITE_DIR, builtImage, extraRequirements } from './job-parts.ts';
export { BUILT_SITE_DIR, builtImage, extraRequirements, ownSecret } from './job-parts.ts';
import { sourcesVolume } from './runner-sources.ts';
import { ANNOTATIONS, CONTAINERS, LABELS, MANAGED_BY, POD_UID, RELEASE_FILE, executionLabel, jobNameFor, restrictedContainerSecurity } from '../names.ts';

/** The two objects of one run. The Secret gets its owner reference once the Job's uid is known. */
export interface RunObjects {
  secret: V1Secret;
  job: V1Job;
}

/** Inputs of {@link buildJob} that are not part of the run or the config. */
export interface BuildJobOptions {
  /** RuntimeClass to run under, or null for the cluster default (only allowed in `permissive`). */
  runtimeClassName: string | null;
  /**
   * The runner sources ConfigMap's name (runs/runner-sources.ts): mounted read-only at /sandpod, so
   * every image runs the service's own runner, and no run's Secret carries its ≈ 70 KB.
   */
  sources: string;
  /**
   * With `kubernetes.egress_proxy`: the key its credentials are signed with and the time of signing
   * (ms). Bridge types with `allowed_hosts` then reach the network through the proxy only. `address`:
   * the proxy host resolved by the service (the pod then gets that address and needs no DNS).
   */
  egressProxy?: EgressProxyCredentials | null;
  /**
   * A pool pod's Job (pool-plan.ts): a proxied type's pod carries the egress label (its NetworkPolicy)
   * but no credentials; those reach the runner on the go line when the pod is claimed.
   */
  egressAtClaim?: boolean;
}

/** What signs a run's egress proxy credential (see {@link BuildJobOptions.egressProxy}). */
export interface EgressProxyCredentials {
  key: Buffer | string;
  nowMs: number;
  address?: string | null;
}

/**
 * The egress proxy URL of a run of a proxied type: the proxy's address with the run's HMAC-signed
 * credential (its execution id, its `allowed_hosts`, an expiry past its Job's deadline). A cold run
 * gets it in its command (below), a claimed pool pod on its go line (runs/hand-over.ts). Pure.
 */
export function egressProxyUrlFor(spec: Pick<RunSpec, 'executionId' | 'timeoutSec' | 'startupTimeoutSec' | 'jobType'>, config: Pick<BuildJobConfig, 'kubernetes'>, creds: EgressProxyCredentials): string | null {
  const k = config.kubernetes;
  if (!k.egress_proxy) return null;
  const expiresAtMs = creds.nowMs + (jobDeadlineSeconds(spec, k.deadline_grace_seconds) + EGRESS_TOKEN_MARGIN_SECONDS) * 1000;
  const base = new URL(k.egress_proxy.url);
  if (creds.address) base.hostname = creds.address.includes(':') ? `[${creds.address}]` : creds.address;
  return egressProxyUrl(base.toString(), { executionId: spec.executionId, allowedHosts: [...spec.jobType.network.allowedHosts], expiresAtMs }, creds.key);
}

/** How long a run's proxy credential outlives its Job's deadline (clock skew between service and proxy). */
export const EGRESS_TOKEN_MARGIN_SECONDS = 120;

/** The slice of the configuration the builder reads. */
export type BuildJobConfig = Pick<Config, 'kubernetes' | 'enable_seccomp' | 'docker_image' | 'pip'>;

/** The Secret key of the `i`th input file (mounted at `/input/files/<name>`). */
export function inputFileKey(i: number): string {
  return `file-${i}`;
}

/** Secret keys and where they are mounted. */
export const SECRET_KEYS = { code: 'main.py', input: 'data.json' } as const;

const SAFE_PATH = '/usr/local/bin:/usr/bin:/bin';
/** The collector only runs `sh`, `sleep` and `tar`: its limits, and its requests in a pod that is not Guaranteed. */
const COLLECTOR_LIMITS = { cpu: '100m', memory: '64Mi', 'ephemeral-storage': '16Mi' };
const COLLECTOR_REQUESTS = { cpu: '10m', memory: '32Mi', 'ephemeral-storage': '16Mi' };
/** Room for installed packages (the `deps` emptyDir counts against the pod's ephemeral storage). */
const DEPS_EPHEMERAL_STORAGE = 1024 ** 3;
const MIN_MAIN_EPHEMERAL_STORAGE = 256 * 1024 ** 2;
const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** A service-style size (`512m` = 512 MiB) as a Kubernetes quantity (`512Mi`). */
export function toQuantity(size: string | number): string {
  const bytes = typeof size === 'number' ? size : parseMemory(size);
  const mi = 1024 ** 2;
  if (bytes % (1024 * mi) === 0 && bytes > 0) return `${bytes / (1024 * mi)}Gi`;
  if (bytes % mi === 0 && bytes > 0) return `${bytes / mi}Mi`;
  if (bytes % 1024 === 0 && bytes > 0) return `${bytes / 1024}Ki`;
  return String(bytes);
}

/** CPUs as millicores (`0.5` → `500m`), never below 1m. */
export function toCpuQuantity(cpus: number): string {
  return `${Math.max(1, Math.round(cpus * 1000))}m`;
}

/** CPU and memory of a run's containers as Kubernetes quantities. */
export interface RunResources {
  requests: { cpu: string; memory: string };
  limits: { cpu: string; memory: string };
  /** Requests equal limits (in every container, the collector follows): the pod is Guaranteed. */
  guaranteed: boolean;
}

/**
 * What a run's `main` (and `deps`) container requests and is limited to. Limits are the job type's.
 * Requests are the job type's `cpuRequest` / `memoryRequest` when set, else `fractions` of the limits
 * (`kubernetes.cpu_request_fraction`, default 0.25, and `memory_request_fraction`, default 0.5): a
 * short run or an idle pod then reserves a quarter of a CPU, not a whole one, and the scheduler packs
 * several on a node while each can still burst to its limit. Requests never exceed limits, are never
 * zero, and a fractional memory request of a limit in whole MiB is rounded down to whole MiB.
 */
export function runResources(jobType: Pick<JobType, 'cpuLimit' | 'cpuRequest' | 'memoryLimit' | 'memoryRequest'>, fractions: { cpu: number; memory: number }): RunResources {
  const cpuLimitM = Math.max(1, Math.round(jobType.cpuLimit * 1000));
  const cpuRequestM = Math.min(cpuLimitM, Math.max(1, Math.round((jobType.cpuRequest ?? jobType.cpuLimit * fractions.cpu) * 1000)));
  const memLimit = parseMemory(jobType.memoryLimit);
  const mi = 1024 ** 2;
  let memRequest: number;
  if (jobType.memoryRequest !== null) memRequest = parseMemory(jobType.memoryRequest);
  else {
    const raw = memLimit * fractions.memory;
    memRequest = memLimit % mi === 0 && raw >= mi ? Math.floor(raw / mi) * mi : Math.floor(raw);
  }
  memRequest = Math.max(1, Math.min(memLimit, memRequest));
  return {
    requests: { cpu: `${cpuRequestM}m`, memory: toQuantity(memRequest) },
    limits: { cpu: `${cpuLimitM}m`, memory: toQuantity(memLimit) },
    guaranteed: cpuRequestM === cpuLimitM && memRequest === memLimit,
  };
}

/** The executor image: `kubernetes.executor_image`, else `docker_image`. */
export function executorImage(config: BuildJobConfig): string {
  return config.kubernetes.executor_image ?? config.docker_image;
}

/** `activeDeadlineSeconds` of a run's Job: startup + execution timeout + grace, whole seconds. */
export function jobDeadlineSeconds(spec: Pick<RunSpec, 'startupTimeoutSec' | 'timeoutSec'>, graceSec: number): number {
  return Math.max(1, Math.ceil(spec.startupTimeoutSec + spec.timeoutSec + graceSec));
}

/**
 * The RuntimeClass of a run pod: `kubernetes.runtime_class_network_none` for a `network: none` job type
 * when the run gets the gVisor class at all (`base`, null in permissive mode without it), else `base`.
 * That class's runsc handler runs with `--network=none`: no interface but loopback, however the CNI
 * treats NetworkPolicy (issue 23; SECURITY.md "Network").
 */
export function runtimeClassForRun(network: JobType['network']['mode'], base: string | null, config: Pick<BuildJobConfig, 'kubernetes'>): string | null {
  const none = config.kubernetes.runtime_class_network_none;
  return network === 'none' && base !== null && none ? none : base;
}

/** Pod fields of a `network: none` pod: no resolver at all (127.0.0.1 has nothing listening, lookups fail at once). */
export function noNetworkDns(): Pick<V1PodSpec, 'dnsPolicy' | 'dnsConfig'> {
  return { dnsPolicy: 'None', dnsConfig: { nameservers: ['127.0.0.1'], searches: [], options: [{ name: 'ndots', value: '1' }] } };
}

/**
 * Builds the Secret and the Job of one run. Pure: same inputs, same objects (snapshot-tested and
 * validated against the Kubernetes OpenAPI schemas in `test/unit/runtime/kubernetes`).
 */
export function buildJob(spec: RunSpec, jobType: JobType, config: BuildJobConfig, opts: BuildJobOptions): RunObjects {
  const k = config.kubernetes;
  const name = jobNameFor(spec.executionId);
  const network = jobType.network.mode;
  const runtimeClassName = runtimeClassForRun(network, opts.runtimeClassName, config);
  const proxiedType = network === 'bridge' && jobType.network.allowedHosts.length > 0 && k.egress_proxy !== null;
  const proxied = proxiedType && opts.egressProxy ? opts.egressProxy : null;
  const egressLabel = proxied !== null || (proxiedType && opts.egressAtClaim === true);
  const labels: Record<string, string> = {
    [LABELS.managedBy]: MANAGED_BY,
    [LABELS.executionId]: executionLabel(spec.executionId),
    [LABELS.jobType]: jobType.name,
    [LABELS.instance]: k.instance,
    [LABELS.network]: network,
    ...(egressLabel ? { [LABELS.egress]: 'proxy' } : {}),
  };
  const annotations: Record<string, string> = {
    [ANNOTATIONS.executionId]: spec.executionId,
    [ANNOTATIONS.jobRef]: jobRef(jobType),
    [ANNOTATIONS.timeout]: String(spec.timeoutSec),
    [ANNOTATIONS.startupTimeout]: String(spec.startupTimeoutSec),
  };
  // A built job type (jobtypes/builds.ts pinned the run to it): its image by digest, whose layer holds
  // the type's requirements; only requirements the request adds beyond those are installed.
  const built = builtImage(jobType);
  const image = built ?? jobType.image ?? executorImage(config);
  const extra = built ? extraRequirements(spec.requirements, jobType.requirements) : spec.requirements;
  const hasDeps = extra.length > 0;
  const res = runResources(jobType, { cpu: k.cpu_request_fraction, memory: k.memory_request_fraction });
  const fileSize = parseMemory(jobType.maxFileSize);
  const mainStorage = toQuantity(Math.max(MIN_MAIN_EPHEMERAL_STORAGE, 2 * fileSize));

  const containerSecurity: V1SecurityContext = restrictedContainerSecurity();
  const podSecurity: V1PodSecurityContext = {
    runAsNonRoot: true,
    runAsUser: POD_UID,
    runAsGroup: POD_UID,
    fsGroup: POD_UID,
    ...(config.enable_seccomp ? { seccompProfile: { type: 'RuntimeDefault' } } : {}),
  };
  // Every process starts from `env -i`: the kubelet injects KUBERNETES_* into each container, and
  // with a clean exec even PID 1's /proc/1/environ shows only what we chose.
  const cleanEnv = ['/usr/bin/env', '-i', `PATH=${SAFE_PATH}`, 'HOME=/tmp', 'TMPDIR=/tmp', 'LANG=C.UTF-8'];

  const runnerArgs = [
    'python3',
    '/sandpod/runner.py',
    '--code',
    `/code/${SECRET_KEYS.code}`,
    '--input',
    `/input/${SECRET_KEYS.input}`,
    '--output',
    '/output',
    '--timeout',
    String(spec.timeoutSec),
    '--max-stream-bytes',
    String(spec.maxStdoutBytes),
    '--tee',
    '--cwd',
    '/tmp',
    '--rlimit',
    `fsize=${fileSize}`,
    '--rlimit',
    'core=0',
  ];
  // RLIMIT_NPROC counts every process of uid 1000 in the kernel: per pod under gVisor (one kernel per
  // sandbox), but node-wide on a shared kernel, where it would fail forks because of other runs.
  if (opts.runtimeClassName) runnerArgs.push('--rlimit', `nproc=${jobType.maxProcesses}`);
  if (hasDeps) runnerArgs.push('--python-path', '/deps');
  if (built) runnerArgs.push('--python-path', BUILT_SITE_DIR);
  for (const [key, value] of Object.entries(jobType.env).sort(([a], [b]) => a.localeCompare(b))) {
    if (ENV_NAME_RE.test(key)) runnerArgs.push('--env', `${key}=${value}`);
  }
  const proxyUrl = proxied ? egressProxyUrlFor({ ...spec, jobType }, config, proxied) : null;
  if (proxyUrl) {
    // After the job type's env: these win. NO_PROXY empty, so every request goes through the proxy.
    for (const v of ['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy']) runnerArgs.push('--env', `${v}=${proxyUrl}`);
    runnerArgs.push('--env', 'NO_PROXY=', '--env', 'no_proxy=');
  }
  for (const [key, value] of Object.entries(runEnv(spec))) runnerArgs.push('--env', `${key}=${value}`);

  // Ephemeral storage is requested at its limit: it is not what fills nodes, and eviction for it is abrupt.
  const resources = (storage: string) => ({
    requests: { ...res.requests, 'ephemeral-storage': storage },
    limits: { ...res.limits, 'ephemeral-storage': storage },
  });
  const mount = (n: string, mountPath: string, readOnly = false) => ({ name: n, mountPath, ...(readOnly ? { readOnly } : {}) });

  const main: V1Container = {
    name: CONTAINERS.main,
    image,
    imagePullPolicy: k.image_pull_policy,
    command: [...cleanEnv, ...runnerArgs],
    workingDir: '/tmp',
    resources: resources(mainStorage),
    securityContext: containerSecurity,
    volumeMounts: [
      mount('code', '/code', true),
      mount('input', '/input', true),
      mount('runner', '/sandpod', true),
      mount('output', '/output'),
      mount('tmp', '/tmp'),
      ...(hasDeps ? [mount('deps', '/deps', true)] : []),
    ],
    terminationMessagePolicy: 'File',
  };
  const collector: V1Container = {
    name: CONTAINERS.collector,
    image: executorImage(config),
    imagePullPolicy: k.image_pull_policy,
    // Holds /output until the controller has pulled it, then exits 0 so the pod (and Job) complete.
    command: [
      '/bin/sh',
      '-c',
      `trap 'exit 0' TERM INT; while [ ! -e ${RELEASE_FILE} ]; do sleep 0.2; done`,
    ],
    // Equal to its limits only when the job type asks for a Guaranteed pod (every container must be).
    resources: { requests: { ...(res.guaranteed ? COLLECTOR_LIMITS : COLLECTOR_REQUESTS) }, limits: { ...COLLECTOR_LIMITS } },
    securityContext: containerSecurity,
    volumeMounts: [mount('output', '/output', true), mount('control', '/control')],
  };
  const initContainers: V1Container[] = [];
  if (hasDeps) {
    const pipArgs = ['--no-cache-dir', '--disable-pip-version-check', '--no-input', '--no-warn-script-location'];
    if (config.pip.index_url) pipArgs.push('--index-url', config.pip.index_url);
    for (const link of config.pip.find_links) pipArgs.push('--find-links', link);
    if (config.pip.no_index) pipArgs.push('--no-index');
    pipArgs.push(...config.pip.extra_args);
    initContainers.push({
      name: CONTAINERS.deps,
      image,
      imagePullPolicy: k.image_pull_policy,
      // Requirements are positional arguments after `--`: never parsed by the shell, never taken as
      // pip options.
      command: [
        ...cleanEnv,
        '/bin/sh',
        '-c',
        `printf 'startup\\n' > /output/.svc_phase && exec python3 -m pip install ${pipArgs.map(shQuote).join(' ')} --target /deps -- "$@"`,
        'deps',
        ...extra,
      ],
      resources: resources(toQuantity(DEPS_EPHEMERAL_STORAGE)),
      securityContext: containerSecurity,
      volumeMounts: [mount('deps', '/deps'), mount('output', '/output'), mount('tmp', '/tmp')],
      terminationMessagePolicy: 'FallbackToLogsOnError',
    });
  }

  const secretVolume = (volName: string, key: string, more: { key: string; path: string }[] = []): V1Volume => ({
    name: volName,
    secret: { secretName: name, defaultMode: 0o444, items: [{ key, path: key }, ...more] },
  });
  // Input files (issue 19) ride in the same Secret, under keys of their own (a Secret key allows fewer
  // characters than a file name), and appear in the read-only /input volume as files/<name>.
  const inputFiles = spec.inputFiles ?? [];
  const volumes: V1Volume[] = [
    secretVolume('code', SECRET_KEYS.code),
    secretVolume('input', SECRET_KEYS.input, inputFiles.map((f, i) => ({ key: inputFileKey(i), path: `files/${f.name}` }))),
    sourcesVolume(opts.sources),
    { name: 'output', emptyDir: {} },
    { name: 'tmp', emptyDir: {} },
    { name: 'control', emptyDir: { sizeLimit: '1Mi' } },
    ...(hasDeps ? [{ name: 'deps', emptyDir: {} }] : []),
  ];

  const job: V1Job = {
    apiVersion: 'batch/v1',
    kind: 'Job',
    metadata: { name, namespace: k.runs_namespace, labels: { ...labels }, annotations: { ...annotations } },
    spec: {
      backoffLimit: 0,
      activeDeadlineSeconds: jobDeadlineSeconds(spec, k.deadline_grace_seconds),
      ttlSecondsAfterFinished: k.ttl_seconds_after_finished,
      template: {
        metadata: { labels: { ...labels }, annotations: { ...annotations } },
        spec: {
          restartPolicy: 'Never',
          ...(runtimeClassName ? { runtimeClassName } : {}),
          automountServiceAccountToken: false,
          enableServiceLinks: false,
          terminationGracePeriodSeconds: 5,
          securityContext: podSecurity,
          ...(network === 'none' ? noNetworkDns() : { dnsPolicy: 'ClusterFirst' }),
          ...(initContainers.length > 0 ? { initContainers } : {}),
          containers: [main, collector],
          volumes,
        },
      },
    },
  };

  const secret: V1Secret = {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name, namespace: k.runs_namespace, labels: { ...labels }, annotations: { [ANNOTATIONS.executionId]: spec.executionId } },
    type: 'Opaque',
    immutable: true,
    data: {
      [SECRET_KEYS.code]: Buffer.from(spec.code, 'utf8').toString('base64'),
      [SECRET_KEYS.input]: Buffer.from(spec.inputJson, 'utf8').toString('base64'),
      ...Object.fromEntries(inputFiles.map((f, i) => [inputFileKey(i), f.data.toString('base64')])),
    },
  };
  return { secret, job };
}

function shQuote(s: string): string {
  return /^[A-Za-z0-9_./:=@%+-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}
