/**
 * Turns what a runtime reported (a {@link RawRun}) into the record's status, exit code and error,
 * the same way for every runtime (SPEC §3, §7.2, §7.3). Trusted observations decide first; the
 * runner's report (untrusted: user code can forge it) is used only when it agrees with the exit status
 * the runtime saw, and then only to name the Python exception.
 */
import { RUNNER_ERROR_EXIT, RUNNER_TIMEOUT_EXIT } from '../runtime/run-output.ts';
import type { RawRun } from '../runtime/runtime.ts';
import { jsonDepth, JsonDepthError, MAX_JSON_DEPTH, parseJson } from '../util/json.ts';
import type { TerminalStatus } from './status.ts';

/** SPEC §2.6 error object. */
export interface RunError {
  type: string;
  message: string;
  phase?: 'startup' | 'execution';
}

/** SPEC §2.4 timing object. */
export interface Timing {
  startup_ms: number;
  dep_install_ms: number;
  execution_ms: number;
  total_ms: number;
  phase_at_exit: 'startup' | 'execution' | 'completed' | 'failed';
}

/** SPEC §2.3 resource usage. */
export interface ResourceUsage {
  max_rss_mb: number;
  cpu_time_ms: number;
  wall_time_ms: number;
}

/** The verdict on one run. */
export interface Classification {
  status: TerminalStatus;
  exitCode: number | null;
  error: RunError | null;
  output: unknown;
  timing: Timing;
  resourceUsage: ResourceUsage;
}

/** SPEC §7.2 signal rows: exit code (128 + signal) → error type. */
export const SIGNAL_TYPES: Readonly<Record<number, string>> = {
  137: 'oom',
  143: 'cancelled',
  139: 'segfault',
  134: 'abort',
  136: 'arithmetic_error',
  135: 'bus_error',
  141: 'pipe_error',
};

/** SPEC §7.2 Python exception rows (plus the "other" rows that name exception families). */
export const EXCEPTION_TYPES: Readonly<Record<string, string>> = {
  SyntaxError: 'syntax_error',
  IndentationError: 'syntax_error',
  TabError: 'syntax_error',
  ModuleNotFoundError: 'import_error',
  ImportError: 'import_error',
  TypeError: 'type_error',
  ValueError: 'value_error',
  KeyError: 'key_error',
  IndexError: 'index_error',
  AttributeError: 'attribute_error',
  NameError: 'name_error',
  UnboundLocalError: 'name_error',
  FileNotFoundError: 'file_not_found',
  IsADirectoryError: 'file_error',
  NotADirectoryError: 'file_error',
  PermissionError: 'permission',
  ConnectionError: 'network_error',
  ConnectionRefusedError: 'network_error',
  ConnectionResetError: 'network_error',
  ConnectionAbortedError: 'network_error',
  gaierror: 'network_error',
  TimeoutError: 'network_timeout',
  timeout: 'network_timeout',
  RecursionError: 'recursion_error',
  AssertionError: 'assertion_error',
  ZeroDivisionError: 'division_error',
  OverflowError: 'overflow_error',
  JSONDecodeError: 'json_error',
  UnicodeError: 'encoding_error',
  UnicodeDecodeError: 'encoding_error',
  UnicodeEncodeError: 'encoding_error',
  OSError: 'os_error',
  IOError: 'os_error',
  MemoryError: 'oom',
};

const MAX_MESSAGE = 2000;

/** Classifies one run. Pure. */
export function classify(raw: RawRun): Classification {
  const obs = raw.observation;
  const report = raw.report;
  const verdict = decideStatus(raw);
  const timing: Timing = {
    startup_ms: Math.max(0, Math.round(obs.startupMs)),
    dep_install_ms: Math.max(0, Math.round(obs.depInstallMs)),
    execution_ms: Math.max(0, Math.round(obs.executionMs)),
    total_ms: Math.max(0, Math.round(obs.totalMs)),
    phase_at_exit:
      verdict.error?.phase ?? (verdict.status === 'succeeded' ? 'completed' : obs.phase === 'startup' ? 'startup' : 'failed'),
  };
  const reportRssMb = typeof report?.max_rss_kb === 'number' && report.max_rss_kb >= 0 ? report.max_rss_kb / 1024 : 0;
  const reportCpu = typeof report?.cpu_time_ms === 'number' && report.cpu_time_ms >= 0 ? report.cpu_time_ms : 0;
  const resourceUsage: ResourceUsage = {
    max_rss_mb: round2(obs.maxRssMb ?? reportRssMb),
    cpu_time_ms: Math.round(obs.cpuTimeMs ?? reportCpu),
    wall_time_ms: timing.execution_ms,
  };
  return { ...verdict, timing, resourceUsage };
}

function decideStatus(raw: RawRun): Pick<Classification, 'status' | 'exitCode' | 'error' | 'output'> {
  const obs = raw.observation;
  const exit = obs.exitCode;
  const fail = (status: TerminalStatus, type: string, message: string, exitCode = exit, phase?: 'startup' | 'execution') => ({
    status,
    exitCode: exitCode,
    error: { type, message: clip(message), ...(phase ? { phase } : {}) },
    output: null,
  });

  if (obs.cancelled) return fail('cancelled', 'cancelled', 'cancelled by user');
  if (obs.timedOut === 'startup') {
    return fail('timeout', 'startup_timeout', 'startup phase exceeded startup_timeout (sandbox creation and dependency installation)', null, 'startup');
  }
  if (obs.infraError) return fail('failed', obs.infraError.type, obs.infraError.message);
  if (obs.dependencyError !== null) {
    return fail('failed', 'dependency_error', `dependency installation failed: ${obs.dependencyError}`);
  }
  if (obs.timedOut === 'execution') return fail('timeout', 'execution_timeout', 'code exceeded its execution timeout', null, 'execution');
  if (obs.oomKilled) return fail('oom', 'oom', 'out of memory: the run exceeded its memory limit', 137);
  if (exit === null) return fail('failed', 'internal_error', 'the sandbox ended without an exit status');

  // The report is believed only when it agrees with what the runtime saw.
  const report = raw.report && raw.report.exit_code === exit ? raw.report : null;

  // On a timeout the runner exits 124 and reports no exit code of the (killed) program.
  if (exit === RUNNER_TIMEOUT_EXIT && raw.report?.timed_out) {
    return fail('timeout', 'execution_timeout', 'code exceeded its execution timeout', null, 'execution');
  }
  if (exit === 0) {
    const parsed = parseResult(raw);
    if (!parsed.ok) return { ...fail('failed', 'json_error', parsed.message), output: null };
    return { status: 'succeeded', exitCode: 0, error: null, output: parsed.value };
  }
  if (exit > 128 && exit < 160) {
    const type = SIGNAL_TYPES[exit] ?? 'killed';
    if (type === 'oom') {
      if (obs.oomDetectable) return fail('failed', 'killed', `killed by signal ${exit - 128} (SIGKILL), not by the memory limit`);
      return fail('oom', 'oom', 'out of memory: the run was killed (exit 137)');
    }
    return fail('failed', type, `killed by signal ${exit - 128}${SIGNAL_NAMES[exit - 128] ? ` (${SIGNAL_NAMES[exit - 128]})` : ''}`);
  }
  if (exit === RUNNER_ERROR_EXIT && !report) return fail('failed', 'internal_error', 'the sandbox runner failed before running the code');
  const exception = report?.exception ?? null;
  if (exception) {
    const type = exceptionType(exception, report?.exception_mro ?? null);
    const detail = report?.exception_message ? `${exception}: ${report.exception_message}` : exception;
    if (type === 'oom') return fail('oom', 'oom', `out of memory: ${detail}`, exit);
    if (type === 'import_error' && report?.missing_module) {
      return fail('failed', type, `${detail} (module '${report.missing_module}' is not available in this job type)`);
    }
    return fail('failed', type, detail);
  }
  return fail('failed', 'runtime_error', `process exited with code ${exit}`);
}

/** Maps an exception class (and its MRO when known) to a SPEC §7.2 type. */
export function exceptionType(name: string, mro: readonly string[] | null): string {
  for (const cls of mro && mro.length > 0 ? mro : [name]) {
    const t = EXCEPTION_TYPES[cls];
    if (t) return t;
  }
  return EXCEPTION_TYPES[name] ?? 'runtime_error';
}

function parseResult(raw: RawRun): { ok: true; value: unknown } | { ok: false; message: string } {
  if (raw.resultJsonTooLarge) return { ok: false, message: 'result.json is larger than max_artifact_bytes and was not read' };
  if (raw.resultJson === null) return { ok: true, value: null };
  let value: unknown;
  try {
    // Numbers kept exactly: the record returns 12345678901234567890 as the program wrote it.
    value = parseJson(raw.resultJson);
  } catch (err) {
    if (err instanceof JsonDepthError) return { ok: false, message: `/output/result.json nests deeper than ${MAX_JSON_DEPTH} levels` };
    return { ok: false, message: `/output/result.json is not valid JSON: ${(err as Error).message}` };
  }
  // A deeper value could not be stored and served back (serializing it overflows the stack).
  if (jsonDepth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) return { ok: false, message: `/output/result.json nests deeper than ${MAX_JSON_DEPTH} levels` };
  return { ok: true, value };
}

const SIGNAL_NAMES: Record<number, string> = {
  1: 'SIGHUP', 2: 'SIGINT', 3: 'SIGQUIT', 4: 'SIGILL', 5: 'SIGTRAP', 6: 'SIGABRT', 7: 'SIGBUS', 8: 'SIGFPE',
  9: 'SIGKILL', 11: 'SIGSEGV', 13: 'SIGPIPE', 14: 'SIGALRM', 15: 'SIGTERM', 24: 'SIGXCPU', 25: 'SIGXFSZ', 31: 'SIGSYS',
};

function clip(s: string): string {
  return s.length > MAX_MESSAGE ? `${s.slice(0, MAX_MESSAGE)}…` : s;
}

function round2(n: number): number {
  return Math.round(n * 100) / 100;
}
