/**
 * What a run leaves behind, the same for every runtime: the names of the files the runner writes to
 * `/output`, the runner's report parsed as untrusted input, the content type of an artifact, and the
 * empty result a run has before anything happened. The local runtime reads `/output` from disk
 * (`local/runs/collect.ts`), the Kubernetes runtime from a tar stream (`kubernetes/output-tar.ts`); both
 * take these rules from here, so the same file gives the same record on either.
 *
 * Content types: the `mime-types` package (the mime-db table) decides from the file name's extension
 * as `path.extname` sees it, so a name without a dot or a dotfile (`.csv`) has none. A few formats
 * that data programs write and mime-db does not know are added below (mime-db is the maintained
 * table; this only fills its gaps). Unknown or no extension → `application/octet-stream`. Text types
 * (`text/*`) carry `; charset=utf-8`, since artifacts are served as stored and Python writes UTF-8;
 * nothing else carries a charset (RFC 8259 defines none for `application/json`, which is UTF-8 by
 * definition).
 */
import path from 'node:path';
import mime from 'mime-types';
import * as v from 'valibot';
import type { RawRun, RunnerReport, RunObservation } from './runtime.ts';

/** The runner's phase file (`startup` / `execution` / …); read by nobody but kept out of artifacts. */
export const PHASE_FILE = '.svc_phase';
/** The runner's report; see {@link parseRunnerReport}. */
export const REPORT_FILE = '.svc_report.json';
/** User code's stdout / stderr as the runner captured them (capped by the runner). */
export const STDOUT_FILE = '.svc_stdout';
export const STDERR_FILE = '.svc_stderr';
/** The program's structured result (SPEC §1.5); kept as `result`, never as an artifact. */
export const RESULT_FILE = 'result.json';

/** Control files the runner writes to `/output`; never kept as artifacts. */
export const CONTROL_FILES = [PHASE_FILE, REPORT_FILE, STDOUT_FILE, STDERR_FILE] as const;
/** Names reserved for input artifacts (SPEC §2.3 `input_artifacts`): listed, never kept. */
export const RESERVED_ARTIFACT_NAMES = ['_code.py', '_input.json'] as const;

/**
 * Entries of `/output` listed as artifacts, on either runtime: the first by name (byte order), the
 * runner's control files and `result.json` not counted. Past it a run's record says
 * `artifacts_truncated` and still counts every entry in `artifacts_total`. It bounds the rows, the
 * reads and the time one run's collection costs.
 */
export const MAX_ARTIFACT_ENTRIES = 1000;

/** Largest report read; a larger one is ignored (the runner's own is a few hundred bytes). */
export const MAX_REPORT_BYTES = 64 * 1024;

/** The runner's exit status when it killed user code for running out of time (runner.py `EXIT_TIMEOUT`). */
export const RUNNER_TIMEOUT_EXIT = 124;
/** The runner's exit status when it failed itself (runner.py `EXIT_RUNNER_ERROR`). */
export const RUNNER_ERROR_EXIT = 125;
/**
 * The exit status of a `--wait` runner whose go channel (stdin, or the --go-port connection) closed before the go line (runner.py
 * `EXIT_NOT_DELIVERED`): no program ran. Locally a retired sandbox ends this way; for a run it means
 * the hand-over failed (in a cluster, an attach that connected and then dropped, or was refused).
 */
export const RUNNER_NOT_DELIVERED_EXIT = 123;

/** A field of the report: kept when it has the right type, dropped (undefined) when it has not. */
const field = <S extends v.GenericSchema>(schema: S) => v.fallback(v.optional(schema), undefined);
const num = v.pipe(v.number(), v.finite());
const str = v.pipe(v.string(), v.maxLength(4096));

/** The report's shape; unknown keys are dropped, ill-typed fields are dropped one by one. */
const REPORT_SCHEMA = v.object({
  phase: field(v.pipe(v.string(), v.maxLength(32))),
  exit_code: field(v.nullable(v.pipe(num, v.integer()))),
  signal: field(v.nullable(v.pipe(num, v.integer()))),
  exception: field(v.nullable(v.pipe(v.string(), v.maxLength(256)))),
  exception_mro: field(v.nullable(v.pipe(v.array(v.pipe(v.string(), v.maxLength(256))), v.maxLength(64)))),
  missing_module: field(v.nullable(v.pipe(v.string(), v.maxLength(256)))),
  exception_message: field(v.nullable(str)),
  execution_ms: field(num),
  max_rss_kb: field(num),
  cpu_time_ms: field(num),
  stdout_truncated: field(v.boolean()),
  stderr_truncated: field(v.boolean()),
  timed_out: field(v.boolean()),
}) satisfies v.GenericSchema<unknown, RunnerReport>;

/**
 * The runner's report from the bytes of `.svc_report.json`. User code runs with the runner's uid and
 * can write this file, so: null when it is over {@link MAX_REPORT_BYTES}, not JSON or not an object;
 * otherwise only the known fields with the right types survive. Callers still cross-check it with
 * what the runtime saw (`executions/classify.ts`).
 */
export function parseRunnerReport(bytes: Buffer | string): RunnerReport | null {
  if (Buffer.byteLength(bytes) > MAX_REPORT_BYTES) return null;
  let value: unknown;
  try {
    value = JSON.parse(typeof bytes === 'string' ? bytes : bytes.toString('utf8'));
  } catch {
    return null;
  }
  if (!value || typeof value !== 'object' || Array.isArray(value)) return null;
  const parsed = v.safeParse(REPORT_SCHEMA, value);
  if (!parsed.success) return null;
  const report: RunnerReport = {};
  for (const [k, val] of Object.entries(parsed.output)) if (val !== undefined) (report as Record<string, unknown>)[k] = val;
  return report;
}

/** Formats mime-db does not know (see the module comment). */
const EXTRA_TYPES: Record<string, string> = {
  parquet: 'application/vnd.apache.parquet',
  py: 'text/x-python',
  jsonl: 'application/x-ndjson',
  ndjson: 'application/x-ndjson',
};

/** The Content-Type of an artifact named `name` (the rule is in the module comment). */
export function contentTypeFor(name: string): string {
  const ext = path.extname(name).slice(1).toLowerCase();
  const type = ext ? mime.lookup(ext) || EXTRA_TYPES[ext] : undefined;
  if (!type) return 'application/octet-stream';
  return type.startsWith('text/') ? `${type}; charset=utf-8` : type;
}

/**
 * The one rule for what a program printed or wrote as text (stdout, stderr, result.json), on every
 * runtime: UTF-8, each invalid sequence as U+FFFD, everything else kept — NUL and a leading BOM too.
 */
export function decodeText(bytes: Uint8Array): string {
  return UTF8.decode(bytes);
}
const UTF8 = new TextDecoder('utf-8', { ignoreBOM: true });

/**
 * The observation of a run at `startedAt` (epoch ms) before anything happened: no exit, no
 * timeout, phase `startup`, all durations 0. Runtimes start from it and fill in what they saw.
 */
export function baseObservation(startedAt: number, over: Partial<RunObservation> = {}): RunObservation {
  return {
    exitCode: null,
    timedOut: null,
    oomKilled: false,
    cancelled: false,
    dependencyError: null,
    infraError: null,
    phase: 'startup',
    startedAt: new Date(startedAt),
    endedAt: new Date(startedAt),
    startupMs: 0,
    depInstallMs: 0,
    executionMs: 0,
    totalMs: 0,
    ...over,
  };
}

/** A run that produced nothing (no streams, report, result or artifacts), with its observation. */
export function emptyRun(observation: RunObservation, over: Partial<Omit<RawRun, 'observation'>> = {}): RawRun {
  return { observation, report: null, stdout: '', stderr: '', stdoutTruncated: false, stderrTruncated: false, resultJson: null, artifacts: [], ...over };
}
