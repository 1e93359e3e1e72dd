/**
 * What the run controller (controller.ts) does with a run pod's outputs: pulls `/output` from the
 * collector, follows the `main` log for live output and reports `installing`, and resolves a finished
 * run with its {@link RawRun}. Functions of the tracked run and the few API handles they need.
 */
import { PassThrough } from 'node:stream';
import type { KubeConfig, V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import { followLog, isApiUnavailable, upgradeRefused, type KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import type { RunObservation } from '../../runtime.ts';
import type { TrackedRun } from './controller.ts';
import { EARLY_COLLECT_INTERVAL_MS } from './decide.ts';
import { COLLECT_COMMAND, CONTAINERS } from '../names.ts';
import { parseOutputTar } from './output-tar.ts';

/** The controller's handles these functions use. */
export interface OutputDeps {
  kubeConfig: KubeConfig;
  api: KubeApi;
  namespace: string;
  clock: Clock;
  log: Logger;
  /** Collection attempts before the outputs are given up as lost. */
  collectAttempts?: number;
  /** Collection attempts the API server did not take before the outputs are given up. */
  collectUnavailableAttempts?: number;
  /** Time limit of one exec, ms. */
  execTimeoutMs?: number;
  /** Deadline of the log follow's response headers, ms. */
  requestTimeoutMs?: number;
}

/**
 * Pulls `/output` from the collector. `early`: tried before the pod's status shows the collector
 * running; a refused exec (not started yet) is no failure, only a later try (decide.ts).
 */
export async function collectOutputs(d: OutputDeps, run: TrackedRun, pod: string, early = false): Promise<void> {
  const ns = d.namespace;
  try {
    const output = await (async () => {
      const pipe = new PassThrough();
      const abort = new AbortController();
      const parsing = parseOutputTar(pipe, run.limits).finally(() => {
        pipe.resume();
      });
      const exec = d.api.exec(ns, pod, CONTAINERS.collector, COLLECT_COMMAND, {
        stdout: pipe,
        signal: abort.signal,
        timeoutMs: d.execTimeoutMs ?? 60_000,
      });
      const [parsed, execRes] = await Promise.allSettled([
        parsing.then((o) => {
          // A cap was hit: stop the producer; what was read is kept.
          if (o.truncated) abort.abort();
          return o;
        }),
        exec,
      ]);
      if (parsed.status === 'rejected') throw execRes.status === 'rejected' ? execRes.reason : parsed.reason;
      if (execRes.status === 'rejected' && !parsed.value.truncated) throw execRes.reason;
      if (execRes.status === 'fulfilled' && parsed.value.entries === 0 && execRes.value.exitCode !== 0) {
        throw new Error(`tar in the collector failed (exit ${execRes.value.exitCode ?? '?'}): ${execRes.value.stderr.slice(0, 500)}`);
      }
      return parsed.value;
    })();
    run.state.collection = { ok: true, output };
    if (early && run.state.warm) run.state.warm.collectedEarly = true;
  } catch (err) {
    if (early && run.state.warm && upgradeRefused(err)) {
      run.state.warm.earlyCollectAt = d.clock.now() + EARLY_COLLECT_INTERVAL_MS;
      return;
    }
    if (isApiUnavailable(err)) {
      // A hung or overloaded API server: the outputs are still in the pod; wait for it.
      run.collectUnavailable = (run.collectUnavailable ?? 0) + 1;
      d.log.warn({ execution_id: run.state.executionId, err: String(err), attempt: run.collectUnavailable }, 'collecting outputs: the API server did not take the exec');
      if (run.collectUnavailable < (d.collectUnavailableAttempts ?? 40)) throw err;
    } else run.collectFailures++;
    const attempts = d.collectAttempts ?? 3;
    d.log.warn({ execution_id: run.state.executionId, err: String(err), attempt: run.collectFailures }, 'collecting outputs failed');
    if (run.collectFailures < attempts && (run.collectUnavailable ?? 0) < (d.collectUnavailableAttempts ?? 40)) throw err;
    run.state.collection = { ok: false, error: String(err instanceof Error ? err.message : err) };
  }
}

/**
 * Progress the pod shows that `decide` has no use for: the `deps` init container running
 * (`installing`), and the `main` container started, whose log is then followed for `onOutput`. The
 * runner runs with `--tee`, so that log is the program's stdout and stderr, merged (the pod log API
 * does not keep them apart): reported as `stdout`, at most what the record keeps of both streams.
 */
export function observeProgress(d: OutputDeps, run: TrackedRun, pod: V1Pod | undefined): void {
  if (!pod?.metadata?.name) return;
  const deps = pod.status?.initContainerStatuses?.find((c) => c.name === CONTAINERS.deps);
  if (!run.installingReported && (deps?.state?.running || deps?.state?.terminated)) {
    run.installingReported = true;
    try {
      run.onPhase?.('installing');
    } catch (err) {
      d.log.warn({ execution_id: run.state.executionId, err: String(err) }, 'onPhase threw');
    }
  }
  const onOutput = run.onOutput;
  if (!onOutput || run.logFollow || run.state.cancelRequested) return;
  const main = pod.status?.containerStatuses?.find((c) => c.name === CONTAINERS.main);
  if (!main?.state?.running && !main?.state?.terminated) return;
  run.logFollow = followLog({
    kubeConfig: d.kubeConfig,
    namespace: d.namespace,
    pod: pod.metadata.name,
    container: CONTAINERS.main,
    limitBytes: run.limits.maxStdoutBytes * 2,
    connectTimeoutMs: d.requestTimeoutMs ?? 30_000,
    onData: (chunk) => {
      try {
        onOutput('stdout', chunk);
      } catch (err) {
        d.log.warn({ execution_id: run.state.executionId, err: String(err) }, 'onOutput threw');
      }
    },
    onEnd: (err) => {
      // Live output is best effort: the record's streams come from the collector either way.
      if (err) d.log.info({ execution_id: run.state.executionId, err: err.message }, 'following the run log stopped');
    },
  });
}

/** Resolves the run with what was collected; `letGo` when its collector's release waits for the caller (release.ts). */
export function resolveRun(log: Logger, run: TrackedRun, observation: RunObservation, letGo?: () => void): void {
  const out = run.state.collection?.ok ? run.state.collection.output : null;
  if (out && (out.rejected.length > 0 || out.truncated)) {
    log.warn({ execution_id: run.state.executionId, rejected: out.rejected, truncated: out.truncated, artifacts_total: out.artifactsTotal }, 'some outputs were refused');
  }
  // The runner cuts its streams at max_stdout_bytes and says so in its report; a stream file longer
  // than the cap (a runner that did not cut) was cut by the parser. Either way the record says so,
  // as on the local runtime.
  run.resolve({
    observation,
    report: out?.report ?? null,
    stdout: out?.stdout ?? '',
    stderr: out?.stderr ?? '',
    stdoutTruncated: (out?.stdoutTruncated ?? false) || out?.report?.stdout_truncated === true,
    stderrTruncated: (out?.stderrTruncated ?? false) || out?.report?.stderr_truncated === true,
    resultJson: out?.resultJson ?? null,
    ...(out?.resultJsonTooLarge ? { resultJsonTooLarge: true } : {}),
    artifacts: out?.artifacts ?? [],
    artifactsTotal: out?.artifactsTotal ?? 0,
    artifactsTruncated: out?.artifactsTruncated ?? false,
    ...(letGo ? { letGo } : {}),
  });
}
