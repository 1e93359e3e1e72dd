/**
 * The pure builder of a session's Job (issue 19): one pod, for one session only, never reused. It is
 * a run Job (build-job.ts, the one builder of what a program sees: RuntimeClass, security context,
 * limits, network labels and DNS, read-only /code and /input) with the changes a session needs, made
 * the way pool-plan.ts makes a pool Job from one:
 *
 * - `main` runs the runner in session mode (`--session`) on a loopback go port (the cell channel),
 *   its working directory `/workspace`, a read-write emptyDir;
 * - the `collector` runs session-collector.py with stdin attached (`stdin`, not `stdinOnce`: a
 *   restarted service attaches again): it writes each cell's code and input into the volumes `main`
 *   mounts read-only, does the files API in /workspace and hands back and empties /output per cell;
 * - runner and collector come from the runner sources ConfigMap (runs/runner-sources.ts), mounted
 *   read-only at /sandpod in both containers, so no Secret holds anything of the session and the
 *   Job is a few KB; the session's requirements, if any, come from the run Job's `deps` init
 *   container;
 * - its deadline is the session's lifetime plus slack; the session id is a label, so a restarted
 *   service finds the pod again.
 */
import type { V1Container, V1Job } from '@kubernetes/client-node';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { RunSpec } from '../../runtime.ts';
import { SECRET_KEYS, buildJob, type BuildJobConfig, type EgressProxyCredentials } from '../runs/build-job.ts';
import { CONTAINERS, LABELS } from '../names.ts';
import { GO_PORT } from '../pool/pool-plan.ts';
import { SOURCES_DIR, SOURCE_FILES, sourcesMount } from '../runs/runner-sources.ts';

/** Labels of session Jobs and pods only. */
export const SESSION_LABELS = {
  /** The session's id (a UUID, a valid label value). */
  sessionId: 'sandpod.io/session-id',
} as const;

/** Room for the cells' code and input in their emptyDirs. */
const DELIVERY_VOLUME_LIMIT = '64Mi';
/** Past its lifetime the service ends a session; the Job's own deadline is a backstop beyond it. */
export const SESSION_DEADLINE_SLACK_SEC = 300;
/** Options the runner takes per cell (from the cell line), and the run Job's working directory. */
const DROPPED_OPTIONS = new Set(['--timeout', '--max-stream-bytes', '--cwd']);

/** Inputs of {@link sessionJob}. */
export interface SessionJobOptions {
  /** The session's id; null for a pooled Job (session-pool-plan.ts), whose claim adds the label. */
  sessionId: string | null;
  /** The Job's name (from the session id, or the pool's random one). */
  name: string;
  runtimeClassName: string | null;
  /** The runner sources ConfigMap's name (its runner and session-collector.py are mounted). */
  sources: string;
  /** The session's requirements beyond its job type's built image (installed by `deps`). */
  requirements: readonly string[];
  /** The session's lifetime, s: the Job's deadline is this plus slack. */
  lifetimeSec: number;
  /** A proxied type's egress credential (bound to the session id, expiring past its deadline). */
  egressProxy?: EgressProxyCredentials | null;
}

/** The Job name of a session: deterministic, so a retried create meets its own Job (409). */
export function sessionJobName(sessionId: string): string {
  return `sps-${sessionId.toLowerCase().replace(/[^a-z0-9-]/g, '-').slice(0, 44)}`;
}

/** The session's Job. Pure. */
export function sessionJob(jobType: JobType, config: BuildJobConfig, o: SessionJobOptions): V1Job {
  const placeholder: RunSpec = {
    executionId: o.sessionId ?? 'session-pool',
    code: '',
    inputJson: '',
    jobType,
    timeoutSec: o.lifetimeSec,
    startupTimeoutSec: 0,
    requirements: [...o.requirements],
    maxStdoutBytes: 0,
    maxArtifactBytes: 0,
  };
  const { job } = buildJob(placeholder, jobType, config, { runtimeClassName: o.runtimeClassName, sources: o.sources, egressProxy: o.egressProxy ?? null });
  const podSpec = job.spec!.template.spec!;
  const strip = (m: Record<string, string> | undefined) => Object.fromEntries(Object.entries(m ?? {}).filter(([k]) => k !== LABELS.executionId));
  const labels = { ...strip(job.metadata?.labels), ...(o.sessionId !== null ? { [SESSION_LABELS.sessionId]: o.sessionId } : {}) };
  const annotations = Object.fromEntries(Object.entries(job.metadata?.annotations ?? {}).filter(([k]) => !k.includes('execution') && !k.includes('timeout')));
  const main = podSpec.containers.find((c) => c.name === CONTAINERS.main)!;
  const collector = podSpec.containers.find((c) => c.name === CONTAINERS.collector)!;
  const cmd = main.command ?? [];
  const at = cmd.indexOf('/sandpod/runner.py');
  const head = cmd.slice(0, at);
  const args: string[] = [];
  for (let i = at + 1; i < cmd.length; i++) {
    const a = cmd[i]!;
    if (DROPPED_OPTIONS.has(a)) i++;
    else if (a !== '--tee') args.push(a);
  }
  const command = [...head, `${SOURCES_DIR}/${SOURCE_FILES.runner}`, ...args, '--session', '--cwd', '/workspace', '--go-port', String(GO_PORT)];
  const mainMounts = [...(main.volumeMounts ?? []), { name: 'workspace', mountPath: '/workspace' }];
  const collectorCommand = [
    ...head.slice(0, head.indexOf('python3')),
    'python3',
    `${SOURCES_DIR}/${SOURCE_FILES.session}`,
    '--go-port',
    String(GO_PORT),
    '--code-dir',
    '/code',
    '--input',
    `/input/${SECRET_KEYS.input}`,
    '--output',
    '/output',
    '--workspace',
    '/workspace',
  ];
  // The collector writes what main only reads (/code, /input), and empties /output after each cell.
  const collectorMounts = [
    { name: 'code', mountPath: '/code' },
    { name: 'input', mountPath: '/input' },
    { name: 'output', mountPath: '/output' },
    { name: 'workspace', mountPath: '/workspace' },
    sourcesMount(),
  ];
  const containers: V1Container[] = podSpec.containers.map((c) => {
    if (c.name === CONTAINERS.main) return { ...main, command, workingDir: '/workspace', volumeMounts: mainMounts };
    if (c.name === CONTAINERS.collector) return { ...collector, command: collectorCommand, volumeMounts: collectorMounts, stdin: true, stdinOnce: false };
    return c;
  });
  const volumes = [
    ...(podSpec.volumes ?? [])
      .filter((v) => v.name !== 'control')
      .map((v) => (v.name === 'code' || v.name === 'input' ? { name: v.name, emptyDir: { sizeLimit: DELIVERY_VOLUME_LIMIT } } : v)),
    { name: 'workspace', emptyDir: {} },
  ];
  return {
    ...job,
    metadata: { name: o.name, namespace: job.metadata?.namespace ?? '', labels: { ...labels }, annotations: { ...annotations } },
    spec: {
      ...job.spec!,
      activeDeadlineSeconds: o.lifetimeSec + SESSION_DEADLINE_SLACK_SEC,
      template: { metadata: { labels: { ...labels }, annotations: { ...annotations } }, spec: { ...podSpec, containers, volumes } },
    },
  };
}
