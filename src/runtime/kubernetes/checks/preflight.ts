/**
 * Preflight (issue #13): at start the runtime runs one canary pod in the runs namespace, exactly as
 * a run pod would be run (RuntimeClass, executor image, restricted security context, seccomp), and
 * checks what Python programs need from the sandbox: starting threads, `select()`, and starting a
 * subprocess. Seen on a real cluster: a gVisor older than its `errnoRet` fix under the
 * `RuntimeDefault` seccomp profile fails `clone()` for threads, so every program that starts one dies
 * with "can't start new thread" while the pods themselves look fine. A failed check makes `/health`
 * degraded with the reason; the canary never blocks start-up or runs.
 *
 * Three parts, like the controller: {@link buildCanaryJob} (pure), {@link preflightVerdict} (pure,
 * from the pod as the informer sees it and the time) and {@link Preflight} (creates the Job, polls
 * the informer cache, deletes the Job).
 */
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { Logger } from '../../../logger.ts';
import { executorImage, type BuildJobConfig } from '../runs/build-job.ts';
import { IMAGE_ERRORS, START_ERRORS } from '../runs/decide.ts';
import { LABELS, MANAGED_BY, POD_UID, restrictedContainerSecurity } from '../names.ts';

/** Label that marks the canary Job and pod (they carry no execution id). */
export const PREFLIGHT_LABEL = 'sandpod.io/role';
export const PREFLIGHT_ROLE = 'preflight';
const CONTAINER = 'canary';

/**
 * The checks, as the canary runs them: each result is `true` or the error text; the JSON goes to the
 * termination message (read from the pod's status: no log or exec call needed).
 */
export const CANARY_SCRIPT = `
import json, os, select, subprocess, sys, threading
res = {}
def check(name, fn):
    try:
        fn()
        res[name] = True
    except BaseException as e:
        res[name] = (type(e).__name__ + ': ' + str(e))[:300]
def threads():
    box = []
    t = threading.Thread(target=lambda: box.append(1))
    t.start()
    t.join(10)
    if box != [1]:
        raise RuntimeError('a thread started but did not run')
def sel():
    r, w = os.pipe()
    os.write(w, b'x')
    ready, _, _ = select.select([r], [], [], 5)
    if ready != [r]:
        raise RuntimeError('select() did not report a readable pipe')
def sub():
    out = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, timeout=30)
    if out.stdout.strip() != b'42':
        raise RuntimeError('subprocess exited %d with %r' % (out.returncode, out.stderr[-200:]))
check('threads', threads)
check('select', sel)
check('subprocess', sub)
doc = json.dumps({'sandpod_preflight': 1, 'checks': res})
try:
    with open('/dev/termination-log', 'w') as f:
        f.write(doc)
except OSError:
    pass
print(doc)
`.trim();

/** Inputs of {@link buildCanaryJob}. */
export interface CanaryOptions {
  /** Job name (unique per attempt). */
  name: string;
  runtimeClassName: string | null;
}

/** The canary Job: the run pod's sandbox (image, RuntimeClass, security context) running the checks. */
export function buildCanaryJob(config: BuildJobConfig, o: CanaryOptions): V1Job {
  const k = config.kubernetes;
  const labels = { [LABELS.managedBy]: MANAGED_BY, [LABELS.instance]: k.instance, [PREFLIGHT_LABEL]: PREFLIGHT_ROLE };
  return {
    apiVersion: 'batch/v1',
    kind: 'Job',
    metadata: { name: o.name, namespace: k.runs_namespace, labels: { ...labels } },
    spec: {
      backoffLimit: 0,
      activeDeadlineSeconds: 600,
      ttlSecondsAfterFinished: 300,
      template: {
        metadata: { labels: { ...labels } },
        spec: {
          restartPolicy: 'Never',
          ...(o.runtimeClassName ? { runtimeClassName: o.runtimeClassName } : {}),
          automountServiceAccountToken: false,
          enableServiceLinks: false,
          terminationGracePeriodSeconds: 1,
          securityContext: {
            runAsNonRoot: true,
            runAsUser: POD_UID,
            runAsGroup: POD_UID,
            ...(config.enable_seccomp ? { seccompProfile: { type: 'RuntimeDefault' } } : {}),
          },
          containers: [
            {
              name: CONTAINER,
              image: executorImage(config),
              imagePullPolicy: k.image_pull_policy,
              command: ['/usr/bin/env', '-i', 'PATH=/usr/local/bin:/usr/bin:/bin', 'HOME=/tmp', 'python3', '-I', '-c', CANARY_SCRIPT],
              resources: { requests: { cpu: '100m', memory: '64Mi' }, limits: { cpu: '500m', memory: '128Mi' } },
              securityContext: restrictedContainerSecurity(),
              terminationMessagePolicy: 'FallbackToLogsOnError',
            },
          ],
        },
      },
    },
  };
}

/** What the preflight found. */
export type PreflightResult =
  | { status: 'running' }
  | { status: 'passed'; checks: Record<string, true> }
  | { status: 'failed'; reason: string; checks?: Record<string, true | string> }
  /** The canary could not tell (image, scheduling, deadline): runs would likely fail the same way. */
  | { status: 'inconclusive'; reason: string };

/**
 * The verdict from the canary pod as last seen (`undefined`: not seen yet) and how long it has been
 * (`elapsedMs` since the Job was created; `timeoutMs` the limit). Pure: table-tested.
 */
export function preflightVerdict(pod: V1Pod | undefined, elapsedMs: number, timeoutMs: number): PreflightResult {
  const c = pod?.status?.containerStatuses?.find((s) => s.name === CONTAINER);
  const waiting = c?.state?.waiting;
  if (waiting?.reason && IMAGE_ERRORS.has(waiting.reason)) {
    return { status: 'inconclusive', reason: `the canary's image cannot be used (${waiting.reason}: ${waiting.message ?? ''})`.trim() };
  }
  const term = c?.state?.terminated;
  if (term) {
    if (term.reason && START_ERRORS.has(term.reason)) {
      return { status: 'failed', reason: `the sandbox could not start a container (${term.reason}: ${term.message ?? ''})`.trim() };
    }
    const doc = parseCanaryReport(term.message);
    if (!doc) {
      return { status: 'failed', reason: `the canary exited ${term.exitCode} without its report: ${(term.message ?? '').trim().slice(-300) || 'no output'}` };
    }
    const failed = Object.entries(doc).filter(([, v]) => v !== true);
    if (failed.length === 0) return { status: 'passed', checks: doc as Record<string, true> };
    return {
      status: 'failed',
      reason: `in the run sandbox ${failed.map(([k, v]) => `${k} failed (${v})`).join('; ')}; with gVisor this is typically a release older than its seccomp errnoRet fix under the RuntimeDefault profile (see the chart README)`,
      checks: doc,
    };
  }
  if (elapsedMs >= timeoutMs) {
    const why = waiting?.reason ?? (pod ? (pod.status?.phase ?? 'Pending') : 'no pod was created');
    return { status: 'inconclusive', reason: `the canary did not finish within ${Math.round(timeoutMs / 1000)} s (${why})` };
  }
  return { status: 'running' };
}

/** The checks of a canary's termination message, or null when it is not one. */
export function parseCanaryReport(message: string | undefined): Record<string, true | string> | null {
  if (!message) return null;
  const line = message.trim().split('\n').reverse().find((l) => l.startsWith('{"sandpod_preflight"'));
  if (!line) return null;
  try {
    const doc = JSON.parse(line) as { checks?: unknown };
    if (!doc.checks || typeof doc.checks !== 'object') return null;
    const out: Record<string, true | string> = {};
    for (const [k, v] of Object.entries(doc.checks as Record<string, unknown>)) out[k] = v === true ? true : String(v);
    return Object.keys(out).length > 0 ? out : null;
  } catch {
    return null;
  }
}

/** What {@link Preflight} uses of the cluster. */
export interface PreflightDeps {
  createJob(job: V1Job): Promise<unknown>;
  deleteJob(namespace: string, name: string): Promise<void>;
  /** The canary's pod from the informer cache, if seen. */
  findPod(jobName: string): V1Pod | undefined;
  clock: Clock;
  log: Logger;
  config: BuildJobConfig;
  runtimeClassName: string | null;
  timeoutMs?: number;
  pollMs?: number;
}

/**
 * Runs one canary Job to a verdict: creates it, asks `verdict` about its pod (as the informer cache
 * has it) every `pollMs` until the answer is no longer `running` or `stopped()`, then deletes the Job.
 * The preflight and the network check (network-check.ts) both run their canaries this way. Rejects
 * only when the Job cannot be created.
 */
export async function runCanaryJob<R extends { status: string }>(
  d: PreflightDeps,
  job: V1Job,
  verdict: (pod: V1Pod | undefined, elapsedMs: number) => R,
  stopped: () => boolean,
): Promise<R> {
  const name = job.metadata!.name!;
  const t0 = d.clock.now();
  await d.createJob(job);
  let v = { status: 'running' } as R;
  while (!stopped()) {
    v = verdict(d.findPod(name), d.clock.now() - t0);
    if (v.status !== 'running') break;
    await new Promise((r) => setTimeout(r, d.pollMs ?? 250));
  }
  await d.deleteJob(d.config.kubernetes.runs_namespace, name).catch((err: unknown) => d.log.warn({ err: String(err), job: name }, 'could not delete a canary Job'));
  return v;
}

/** One preflight per runtime start; {@link result} is what `/health` reports. */
export class Preflight {
  private current: PreflightResult = { status: 'running' };
  private stopped = false;

  constructor(private readonly d: PreflightDeps) {}

  get result(): PreflightResult {
    return this.current;
  }

  stop(): void {
    this.stopped = true;
  }

  /** Runs the canary to a verdict; never throws (a failure to run it is `inconclusive`). */
  async run(): Promise<PreflightResult> {
    const { d } = this;
    const name = `sp-preflight-${d.clock.now().toString(36)}-${Math.random().toString(36).slice(2, 7)}`;
    const timeoutMs = d.timeoutMs ?? 180_000;
    const job = buildCanaryJob(d.config, { name, runtimeClassName: d.runtimeClassName });
    try {
      return this.settle(await runCanaryJob(d, job, (pod, elapsedMs) => preflightVerdict(pod, elapsedMs, timeoutMs), () => this.stopped));
    } catch (err) {
      return this.settle({ status: 'inconclusive', reason: `the canary Job could not be created: ${String(err instanceof Error ? err.message : err)}` });
    }
  }

  private settle(r: PreflightResult): PreflightResult {
    this.current = r;
    if (r.status === 'passed') this.d.log.info({ checks: Object.keys(r.checks) }, 'preflight passed: threads, select() and subprocesses work in run pods');
    else if (r.status !== 'running') this.d.log.error({ preflight: r.status, reason: r.reason }, 'preflight: run pods cannot run ordinary Python programs');
    return r;
  }
}
