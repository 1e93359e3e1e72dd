/**
 * Reads what a run left in its `/output` directory, as root on the host, without trusting any of it.
 *
 * Everything in there was written by user code, so: files are opened with O_NOFOLLOW|O_NONBLOCK and
 * checked to be regular files on the opened descriptor (a symlink to /etc/shadow or a FIFO gets
 * nowhere), reads are capped, and names are taken as they are.
 *
 * Decision on subdirectories: they are not descended into. A subdirectory, like a symlink or any other
 * non-regular entry, is listed as an artifact with `skipped: 'not_regular'` and no data, so the caller
 * can tell the user it was there. At most `MAX_ARTIFACT_ENTRIES` (`../run-output.ts`) entries are
 * listed, the first by name; the rest are counted only (`artifactsTotal`, `artifactsTruncated`).
 * File names, report parsing and content types are the shared ones of `../run-output.ts`.
 *
 * {@link collectRun} is the last step of a run: streams, report, result and artifacts, whether the
 * runner wrote the streams to files, or sent them as frames with its report on its done line (a held
 * warm sandbox), or the program wrote them to the sandbox's own stdout/stderr.
 */
import { createHash } from 'node:crypto';
import { closeSync, constants, fstatSync, lstatSync, openSync, readdirSync, readSync } from 'node:fs';
import path from 'node:path';
import {
  CONTROL_FILES,
  contentTypeFor,
  decodeText,
  MAX_ARTIFACT_ENTRIES,
  MAX_REPORT_BYTES,
  parseRunnerReport,
  REPORT_FILE,
  RESERVED_ARTIFACT_NAMES,
  RESULT_FILE,
  STDERR_FILE,
  STDOUT_FILE,
} from '../../run-output.ts';
import type { CollectedFile, RawRun, RunnerReport, RunObservation } from '../../runtime.ts';
import { EXECUTION_MARKER, type LaunchResult } from './proc.ts';

/** Reads a regular file without following symlinks; null when absent or not a regular file. */
export function readRegularFile(file: string, cap: number): { data: Buffer; size: number; tooLarge: boolean } | null {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch {
    return null;
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) return null;
    const want = Math.min(st.size, cap);
    const buf = Buffer.allocUnsafe(want);
    let off = 0;
    while (off < want) {
      const n = readSync(fd, buf, off, want - off, off);
      if (n <= 0) break;
      off += n;
    }
    return { data: buf.subarray(0, off), size: st.size, tooLarge: st.size > cap };
  } finally {
    closeSync(fd);
  }
}

/** The runner's report, parsed as untrusted ({@link parseRunnerReport}); null when absent or not a regular file. */
export function readReport(outputDir: string): RunnerReport | null {
  const f = readRegularFile(path.join(outputDir, REPORT_FILE), MAX_REPORT_BYTES);
  return f && !f.tooLarge ? parseRunnerReport(f.data) : null;
}

/** A captured stream: text capped at `cap` bytes, truncated when the file was longer. */
export function readStream(outputDir: string, name: typeof STDOUT_FILE | typeof STDERR_FILE, cap: number): { text: string; truncated: boolean } {
  const f = readRegularFile(path.join(outputDir, name), cap);
  if (!f) return { text: '', truncated: false };
  return { text: decodeText(f.data), truncated: f.tooLarge };
}

/** What {@link collectOutputs} found in an output directory. */
export interface CollectedOutputs {
  resultJson: string | null;
  resultJsonTooLarge: boolean;
  /** The first `MAX_ARTIFACT_ENTRIES` entries by name. */
  artifacts: CollectedFile[];
  /** Every entry the program left (control files and `result.json` aside). */
  artifactsTotal: number;
  /** More entries than were listed. */
  artifactsTruncated: boolean;
}

/** `result.json` text and the artifacts of an output directory. */
export function collectOutputs(outputDir: string, maxArtifactBytes: number): CollectedOutputs {
  let entries: string[];
  try {
    entries = readdirSync(outputDir);
  } catch {
    return { resultJson: null, resultJsonTooLarge: false, artifacts: [], artifactsTotal: 0, artifactsTruncated: false };
  }
  const control = new Set<string>(CONTROL_FILES);
  const reserved = new Set<string>(RESERVED_ARTIFACT_NAMES);
  let resultJson: string | null = null;
  let resultJsonTooLarge = false;
  const result = readRegularFile(path.join(outputDir, RESULT_FILE), maxArtifactBytes);
  if (result) {
    resultJsonTooLarge = result.tooLarge;
    resultJson = result.tooLarge ? null : decodeText(result.data);
  }
  // The runner's files and result.json take no slot: they are not the program's artifacts, and a
  // program writing many files must not push its own result out of the list.
  const written = entries.filter((name) => !control.has(name) && name !== RESULT_FILE);
  // The tar parser's order (JavaScript's `<`, UTF-16 code units): the same names are kept on either runtime.
  written.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const artifacts: CollectedFile[] = [];
  for (const name of written.slice(0, MAX_ARTIFACT_ENTRIES)) {
    const file = path.join(outputDir, name);
    const meta = { name, sha256: '', contentType: contentTypeFor(name) };
    let st;
    try {
      st = lstatSync(file);
    } catch {
      continue;
    }
    if (!st.isFile()) {
      artifacts.push({ ...meta, size: 0, skipped: 'not_regular' });
      continue;
    }
    if (reserved.has(name)) {
      artifacts.push({ ...meta, size: st.size, skipped: 'reserved_name' });
      continue;
    }
    if (st.size > maxArtifactBytes) {
      artifacts.push({ ...meta, size: st.size, skipped: 'too_large' });
      continue;
    }
    const f = readRegularFile(file, maxArtifactBytes);
    if (!f) {
      artifacts.push({ ...meta, size: 0, skipped: 'not_regular' });
      continue;
    }
    if (f.tooLarge) {
      artifacts.push({ ...meta, size: f.size, skipped: 'too_large' });
      continue;
    }
    artifacts.push({ ...meta, size: f.data.length, sha256: createHash('sha256').update(f.data).digest('hex'), data: f.data });
  }
  return { resultJson, resultJsonTooLarge, artifacts, artifactsTotal: written.length, artifactsTruncated: written.length > MAX_ARTIFACT_ENTRIES };
}

/** A captured stream as the runner would have kept it: the first `cap` bytes (the caps let one more through). */
function capped(b: Buffer, cap: number): { text: string; truncated: boolean } {
  return { text: decodeText(b.subarray(0, cap)), truncated: b.length > cap };
}

/**
 * Everything but the observation of a finished run: what is in `outputDir`, and — for a program run
 * in the runner's own process (`res.captured`) — the streams this runtime captured and the report the
 * runner would have written, from what this runtime saw plus the exception the runner recorded.
 * `obs` must already hold the run's outcome (phase, timeout, execution time).
 */
export function collectRun(outputDir: string, res: LaunchResult, obs: RunObservation, caps: { maxStdoutBytes: number; maxArtifactBytes: number }): Omit<RawRun, 'observation'> {
  // A held warm sandbox's runner sent its report on the done line and its streams as frames only.
  const inline = res.doneReport !== null && res.framed !== null;
  let report = res.tExec === null ? null : inline ? parseRunnerReport(res.doneReport!) : readReport(outputDir);
  let stdout: { text: string; truncated: boolean };
  let stderr: { text: string; truncated: boolean };
  if (inline) {
    stdout = capped(res.framed!.stdout, caps.maxStdoutBytes);
    stderr = capped(res.framed!.stderr, caps.maxStdoutBytes);
  } else if (res.captured) {
    const c = res.captured;
    const marker = c.stdout.indexOf(EXECUTION_MARKER);
    const userOut = marker >= 0 ? c.stdout.subarray(marker + EXECUTION_MARKER.length) : Buffer.alloc(0);
    stdout = capped(userOut, caps.maxStdoutBytes);
    stderr = capped(c.stderr, caps.maxStdoutBytes);
    const signaled = res.exitCode !== null && res.exitCode > 128;
    // A signal death leaves no report: nothing survived the program to write one (as when a
    // forking runner is killed), and the runtime's own observation says all there is.
    report =
      res.tExec === null || signaled || res.exitCode === null
        ? null
        : {
            phase: obs.phase,
            exit_code: res.exitCode,
            signal: null,
            exception: report?.exception ?? null,
            exception_mro: report?.exception_mro ?? null,
            missing_module: report?.missing_module ?? null,
            exception_message: report?.exception_message ?? null,
            execution_ms: obs.executionMs,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            timed_out: obs.timedOut === 'execution',
          };
  } else {
    stdout = readStream(outputDir, STDOUT_FILE, caps.maxStdoutBytes);
    stderr = readStream(outputDir, STDERR_FILE, caps.maxStdoutBytes);
  }
  const collected = collectOutputs(outputDir, caps.maxArtifactBytes);
  return {
    report,
    stdout: stdout.text,
    stderr: stderr.text,
    stdoutTruncated: stdout.truncated || report?.stdout_truncated === true,
    stderrTruncated: stderr.truncated || report?.stderr_truncated === true,
    resultJson: collected.resultJson,
    ...(collected.resultJsonTooLarge ? { resultJsonTooLarge: true } : {}),
    artifacts: collected.artifacts,
    artifactsTotal: collected.artifactsTotal,
    artifactsTruncated: collected.artifactsTruncated,
  };
}
