/** Builder for RawRun values (classification tests). */
import type { RawRun, RunnerReport, RunObservation } from '../../src/runtime/runtime.ts';

/** A RawRun of a successful `print(1)`; override what a case needs. */
export function makeRaw(obs: Partial<RunObservation> = {}, rest: Partial<Omit<RawRun, 'observation'>> = {}): RawRun {
  const t0 = new Date('2026-01-01T00:00:00Z');
  return {
    observation: {
      exitCode: 0,
      timedOut: null,
      oomKilled: false,
      oomDetectable: true,
      cancelled: false,
      dependencyError: null,
      infraError: null,
      phase: 'completed',
      startedAt: t0,
      endedAt: new Date(t0.getTime() + 50),
      startupMs: 10,
      depInstallMs: 0,
      executionMs: 40,
      totalMs: 50,
      ...obs,
    },
    report: { exit_code: obs.exitCode === undefined ? 0 : obs.exitCode, timed_out: false, max_rss_kb: 10240, cpu_time_ms: 12 },
    stdout: '1\n',
    stderr: '',
    stdoutTruncated: false,
    stderrTruncated: false,
    resultJson: null,
    artifacts: [],
    ...rest,
  };
}

/** Report of an uncaught exception with exit code 1. */
export function exceptionReport(exception: string, mro: string[] = [exception], extra: Partial<RunnerReport> = {}): RunnerReport {
  return { exit_code: 1, exception, exception_mro: mro, exception_message: 'boom', timed_out: false, ...extra };
}
