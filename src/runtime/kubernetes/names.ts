/**
 * Names, labels and fixed paths shared by the Kubernetes runtime's builder, controller and tests.
 * Everything here is a pure function or a constant.
 */
import { createHash } from 'node:crypto';

/** Label keys of every run object (DESIGN.md "Kubernetes shape"). */
export const LABELS = {
  managedBy: 'app.kubernetes.io/managed-by',
  executionId: 'sandpod.io/execution-id',
  jobType: 'sandpod.io/job-type',
  instance: 'sandpod.io/instance',
  /** `none` | `bridge`: the chart's NetworkPolicies select run pods by it. */
  network: 'sandpod.io/network',
  /** `proxy` on bridge pods whose egress goes through the cluster's egress proxy only (absent otherwise). */
  egress: 'sandpod.io/egress',
} as const;

/** Value of {@link LABELS.managedBy}. */
export const MANAGED_BY = 'sandpod';

/** Annotation keys (free text a label value cannot hold). */
export const ANNOTATIONS = {
  executionId: 'sandpod.io/execution-id',
  jobRef: 'sandpod.io/job-ref',
  timeout: 'sandpod.io/timeout-seconds',
  startupTimeout: 'sandpod.io/startup-timeout-seconds',
} as const;

/** Container names of a run pod. */
export const CONTAINERS = { deps: 'deps', main: 'main', collector: 'collector' } as const;

/** Where the collector's release flag lives (an emptyDir only the collector mounts). */
export const RELEASE_FILE = '/control/release';

/**
 * Where an attach pod's collector keeps the claim on its hand-over (deliver.py `--claim`): a symbolic
 * link to `deliver` (the program went on) or `fence` (a run's new holder took the pod first).
 */
export const CLAIM_FILE = '/control/claim';

/**
 * Exec'd in `collector` by a run's new holder that saw no sign of a program started: takes the claim
 * for `fence` unless deliver.py has it. Exit 0: no program will ever run in this pod; 17: deliver.py
 * took it (the go line went, or is on its way: the program runs, or ran); anything else: not known
 * (an older pod without the claim).
 */
export const FENCE_COMMAND: readonly string[] = [
  'python3',
  '-S',
  '-c',
  `import os, sys\ntry:\n    os.symlink('fence', '${CLAIM_FILE}')\nexcept FileExistsError:\n    sys.exit(0 if os.readlink('${CLAIM_FILE}') == 'fence' else 17)`,
];

/** Exec'd in `collector` to stream `/output` (the `kubectl cp` technique). */
export const COLLECT_COMMAND: readonly string[] = ['tar', '-C', '/output', '-cf', '-', '.'];

/** Exec'd in `collector` once `/output` has been pulled: it exits 0 and the pod completes. */
export const RELEASE_COMMAND: readonly string[] = ['/bin/sh', '-c', `: > ${RELEASE_FILE}`];

const LABEL_VALUE_RE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

function shortHash(s: string, n = 10): string {
  return createHash('sha256').update(s).digest('hex').slice(0, n);
}

/**
 * The label value for an execution id: the id itself when it is a valid label value (UUIDs are),
 * otherwise a readable prefix plus a hash. Deterministic, so every replica derives the same value.
 */
export function executionLabel(executionId: string): string {
  if (executionId.length <= 63 && LABEL_VALUE_RE.test(executionId)) return executionId;
  const prefix = executionId.replace(/[^A-Za-z0-9]/g, '').slice(0, 40);
  return `${prefix}-${shortHash(executionId)}`.replace(/^-/, 'x-');
}

/**
 * The Job (and Secret) name of an execution: deterministic, so a create from a second replica or a
 * retried request gets 409 instead of a second Job. At most 52 characters: the Job controller names
 * pods `<job>-<5 chars>` and copies the job name into a label (63 max).
 */
export function jobNameFor(executionId: string): string {
  const clean = executionId.toLowerCase().replace(/[^a-z0-9-]/g, '-').replace(/-+/g, '-').replace(/^-|-$/g, '');
  if (clean === executionId && clean.length > 0 && clean.length <= 48) return `sp-${clean}`;
  return `sp-${clean.slice(0, 37).replace(/-$/, '')}-${shortHash(executionId)}`.replace(/--+/g, '-');
}

/** Label selector for every run object of one service instance. */
export function instanceSelector(instance: string): string {
  return `${LABELS.managedBy}=${MANAGED_BY},${LABELS.instance}=${instance}`;
}

/** The uid and gid sandpod's pods run as (the executor image's unprivileged user). */
export const POD_UID = 1000;

/**
 * The security context of every container sandpod starts (run, build and canary pods): uid
 * {@link POD_UID}, no privileges, no capabilities, a read-only root file system. A fresh object each
 * call, so a caller may extend its own.
 */
export function restrictedContainerSecurity(): {
  runAsNonRoot: true;
  runAsUser: number;
  runAsGroup: number;
  allowPrivilegeEscalation: false;
  readOnlyRootFilesystem: true;
  privileged: false;
  capabilities: { drop: string[] };
} {
  return { runAsNonRoot: true, runAsUser: POD_UID, runAsGroup: POD_UID, allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, privileged: false, capabilities: { drop: ['ALL'] } };
}
