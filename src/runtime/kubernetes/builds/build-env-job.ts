/**
 * The pure builder of a job-type build's batch/v1 Job (SPEC §4.9 in a cluster, issue #11): one pod
 * in the runs namespace, the executor image (by digest), no privileges at all — the security context
 * of a run pod (uid 1000, read-only root, no capabilities, RuntimeDefault seccomp), the same
 * RuntimeClass as runs, no service account token:
 *
 * - init container `pip`: `pip install --target /build/site --report /build/report.json` of the
 *   type's requirements with the configured index / find-links (`--no-compile`: byte code would
 *   carry timestamps; requirements are positional after `--`, never options);
 * - container `hold`: keeps `/build` until the service has streamed it out (`tar`, like a run's
 *   `/output`), then exits 0 when released.
 *
 * The service, not the pod, turns the directory into a layer and pushes it: registry credentials
 * never enter the runs namespace, where the packages' own install code runs.
 */
import type { V1Container, V1Job } from '@kubernetes/client-node';
import { createHash } from 'node:crypto';
import type { Config } from '../../../config.ts';
import { LABELS, MANAGED_BY, POD_UID, RELEASE_COMMAND, RELEASE_FILE, restrictedContainerSecurity } from '../names.ts';

/** Container names of a build pod. */
export const BUILD_CONTAINERS = { pip: 'pip', hold: 'hold' } as const;
/** Label on build Jobs and pods: the job type being built. Run pods never have it. */
export const BUILD_LABEL = 'sandpod.io/build';
/** Exec'd in `hold` to stream the installed directory. */
export const BUILD_COLLECT_COMMAND: readonly string[] = ['tar', '-C', '/build', '-cf', '-', 'site', 'report.json'];
export { RELEASE_COMMAND as BUILD_RELEASE_COMMAND };

const SAFE_PATH = '/usr/local/bin:/usr/bin:/bin';
const HOLD_RESOURCES = { cpu: '50m', memory: '32Mi', 'ephemeral-storage': '16Mi' };

/** Inputs of {@link buildEnvJob}. */
export interface BuildEnvJobInput {
  jobType: string;
  /** Distinguishes this build's Job from every other (the build's id, or a hash of it). */
  buildKey: string;
  /** The executor image the build installs into, by digest. */
  image: string;
  requirements: readonly string[];
  runtimeClassName: string | null;
  /** Whole seconds the Job may run (the build's remaining time). */
  deadlineSeconds: number;
}

export type BuildEnvJobConfig = Pick<Config, 'kubernetes' | 'enable_seccomp' | 'pip'>;

/** The Job's name: `spb-<type, cut>-<hash>`, at most 52 characters (pods add `-xxxxx`). */
export function buildJobName(jobType: string, buildKey: string): string {
  const hash = createHash('sha256').update(`${jobType}\0${buildKey}`).digest('hex').slice(0, 10);
  return `spb-${jobType.slice(0, 37).replace(/-+$/, '')}-${hash}`;
}

/** The pip options from the configuration (index, find-links, extra arguments). */
export function pipOptions(pip: Config['pip']): string[] {
  const out = ['--no-cache-dir', '--disable-pip-version-check', '--no-input', '--no-warn-script-location', '--no-compile'];
  if (pip.index_url) out.push('--index-url', pip.index_url);
  for (const link of pip.find_links) out.push('--find-links', link);
  if (pip.no_index) out.push('--no-index');
  out.push(...pip.extra_args);
  return out;
}

/** Builds the Job. Pure: the same input gives the same object (snapshot- and schema-tested). */
export function buildEnvJob(input: BuildEnvJobInput, config: BuildEnvJobConfig): V1Job {
  const k = config.kubernetes;
  const name = buildJobName(input.jobType, input.buildKey);
  const labels: Record<string, string> = {
    [LABELS.managedBy]: MANAGED_BY,
    [LABELS.instance]: k.instance,
    [LABELS.jobType]: input.jobType,
    [BUILD_LABEL]: input.jobType,
    // The chart's build NetworkPolicy lets these pods reach the package index (and DNS), nothing else.
    [LABELS.network]: 'build',
  };
  const security = restrictedContainerSecurity();
  const cleanEnv = ['/usr/bin/env', '-i', `PATH=${SAFE_PATH}`, 'HOME=/tmp', 'TMPDIR=/tmp', 'LANG=C.UTF-8'];
  const storage = k.build_ephemeral_storage;
  const pipResources = { cpu: k.build_cpu, memory: k.build_memory, 'ephemeral-storage': storage };
  const pip: V1Container = {
    name: BUILD_CONTAINERS.pip,
    image: input.image,
    imagePullPolicy: k.image_pull_policy,
    command: [
      ...cleanEnv,
      'python3',
      '-m',
      'pip',
      'install',
      ...pipOptions(config.pip),
      '--target',
      '/build/site',
      '--report',
      '/build/report.json',
      '--',
      ...input.requirements,
    ],
    workingDir: '/tmp',
    resources: { requests: { ...pipResources }, limits: { ...pipResources } },
    securityContext: security,
    volumeMounts: [
      { name: 'build', mountPath: '/build' },
      { name: 'tmp', mountPath: '/tmp' },
    ],
    terminationMessagePolicy: 'FallbackToLogsOnError',
  };
  const hold: V1Container = {
    name: BUILD_CONTAINERS.hold,
    image: input.image,
    imagePullPolicy: k.image_pull_policy,
    command: ['/bin/sh', '-c', `trap 'exit 0' TERM INT; while [ ! -e ${RELEASE_FILE} ]; do sleep 0.2; done`],
    resources: { requests: { ...HOLD_RESOURCES }, limits: { ...HOLD_RESOURCES } },
    securityContext: security,
    volumeMounts: [
      { name: 'build', mountPath: '/build', readOnly: true },
      { name: 'control', mountPath: '/control' },
    ],
  };
  return {
    apiVersion: 'batch/v1',
    kind: 'Job',
    metadata: { name, namespace: k.runs_namespace, labels: { ...labels }, annotations: { 'sandpod.io/build-key': input.buildKey } },
    spec: {
      backoffLimit: 0,
      activeDeadlineSeconds: Math.max(1, Math.ceil(input.deadlineSeconds)),
      ttlSecondsAfterFinished: k.ttl_seconds_after_finished,
      template: {
        metadata: { labels: { ...labels } },
        spec: {
          restartPolicy: 'Never',
          ...(input.runtimeClassName ? { runtimeClassName: input.runtimeClassName } : {}),
          automountServiceAccountToken: false,
          enableServiceLinks: false,
          terminationGracePeriodSeconds: 5,
          securityContext: {
            runAsNonRoot: true,
            runAsUser: POD_UID,
            runAsGroup: POD_UID,
            fsGroup: POD_UID,
            ...(config.enable_seccomp ? { seccompProfile: { type: 'RuntimeDefault' } } : {}),
          },
          dnsPolicy: 'ClusterFirst',
          initContainers: [pip],
          containers: [hold],
          volumes: [
            { name: 'build', emptyDir: { sizeLimit: storage } },
            { name: 'tmp', emptyDir: { sizeLimit: '1Gi' } },
            { name: 'control', emptyDir: { sizeLimit: '1Mi' } },
          ],
        },
      },
    },
  };
}
