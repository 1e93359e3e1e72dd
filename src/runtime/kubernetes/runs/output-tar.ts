/**
 * Parses the tar stream of a run's `/output` (streamed from the `collector` container) into what a
 * run produced, with limits, as a stream: nothing larger than a limit is ever held in memory, and
 * hostile entries (`../`, absolute names, links, devices, over-long names) never become artifacts.
 * File names, report parsing and content types are the shared ones of `../run-output.ts`.
 *
 * The artifact limit is the local runtime's: the first `MAX_ARTIFACT_ENTRIES` top-level entries by
 * name are listed. tar sends them in directory order, so the parser keeps the smallest names seen so
 * far and drops the largest when a smaller one arrives; past the limit it reads only headers (and
 * lets contents through, counted against `maxTotalBytes`) to count what the program wrote.
 */
import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import * as tar from 'tar-stream';
import {
  contentTypeFor,
  CONTROL_FILES,
  decodeText,
  MAX_ARTIFACT_ENTRIES,
  MAX_REPORT_BYTES,
  parseRunnerReport,
  PHASE_FILE,
  REPORT_FILE,
  RESERVED_ARTIFACT_NAMES,
  RESULT_FILE,
  STDERR_FILE,
  STDOUT_FILE,
} from '../../run-output.ts';
import type { CollectedFile, RunnerReport } from '../../runtime.ts';

/** Limits of one collection. */
export interface OutputLimits {
  /** Largest artifact (and `result.json`) kept, bytes. */
  maxArtifactBytes: number;
  /** Bytes kept of each of `.svc_stdout` / `.svc_stderr`. */
  maxStdoutBytes: number;
  /** Stop reading the stream after this many bytes of file contents in total. */
  maxTotalBytes: number;
  /** Stop after this many archive entries (of any kind, nested ones too): bounds the work of counting. */
  maxEntries: number;
  /** Artifacts listed, the first by name (default `MAX_ARTIFACT_ENTRIES`). */
  maxArtifacts?: number;
}

/** An entry that was refused, and why. Never stored. */
export interface RejectedEntry {
  name: string;
  reason: 'unsafe_name' | 'name_too_long';
}

/** What a run left in `/output`. */
export interface CollectedOutput {
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  report: RunnerReport | null;
  resultJson: string | null;
  resultJsonTooLarge: boolean;
  artifacts: CollectedFile[];
  rejected: RejectedEntry[];
  /** The total or entry cap was hit: later entries were not read. */
  truncated: boolean;
  /** Entries seen in the archive (0 for an empty stream). */
  entries: number;
  /**
   * Top-level entries the program left in `/output`, control files and `result.json` aside, listed
   * or not; when `truncated`, those seen before the stream was cut (a lower bound).
   */
  artifactsTotal: number;
  /** Not every such entry is in `artifacts`: more than `maxArtifacts`, or the stream was cut. */
  artifactsTruncated: boolean;
}

/** Default caps derived from the per-file limits. */
export function defaultOutputLimits(maxArtifactBytes: number, maxStdoutBytes: number): OutputLimits {
  return {
    maxArtifactBytes,
    maxStdoutBytes,
    maxTotalBytes: 16 * maxArtifactBytes + 4 * maxStdoutBytes + 1024 * 1024,
    // Enough to count a program that wrote many times the limit; a tar header is 512 bytes, so
    // this also bounds what the API server streams for headers alone (~25 MiB).
    maxEntries: 50 * MAX_ARTIFACT_ENTRIES,
    maxArtifacts: MAX_ARTIFACT_ENTRIES,
  };
}

const MAX_NAME_BYTES = 1024;
const MAX_SEGMENT_BYTES = 255;
const STREAM_FILES = { [STDOUT_FILE]: 'stdout', [STDERR_FILE]: 'stderr' } as const;
/** Top-level names that are never the program's artifacts, whatever their type. */
const NOT_ARTIFACTS: ReadonlySet<string> = new Set([...CONTROL_FILES, RESULT_FILE]);

/**
 * The artifact name of a tar entry, or why it is refused. `tar -C /output -cf - .` names entries
 * `./a`, `./sub/b`; the leading `./` goes, anything that could escape or confuse a path is refused.
 * Returns `''` for the archive's root directory entry.
 */
export function normalizeEntryName(raw: string): string | RejectedEntry {
  let name = raw;
  while (name.startsWith('./')) name = name.slice(2);
  if (name === '.' || name === '') return '';
  name = name.replace(/\/+$/, '');
  if (Buffer.byteLength(name) > MAX_NAME_BYTES) return { name: raw.slice(0, 200), reason: 'name_too_long' };
  // eslint-disable-next-line no-control-regex
  if (name.startsWith('/') || name.includes('\\') || /[\x00-\x1f\x7f]/.test(name)) return { name: raw, reason: 'unsafe_name' };
  const parts = name.split('/');
  for (const part of parts) {
    if (part === '' || part === '.' || part === '..') return { name: raw, reason: 'unsafe_name' };
    if (Buffer.byteLength(part) > MAX_SEGMENT_BYTES) return { name: raw.slice(0, 200), reason: 'name_too_long' };
  }
  return parts.join('/');
}

const EMPTY_SHA256 = createHash('sha256').digest('hex');

/** What an archive with nothing in it yields. */
export function emptyOutput(): CollectedOutput {
  return {
    stdout: '',
    stderr: '',
    stdoutTruncated: false,
    stderrTruncated: false,
    report: null,
    resultJson: null,
    resultJsonTooLarge: false,
    artifacts: [],
    rejected: [],
    truncated: false,
    entries: 0,
    artifactsTotal: 0,
    artifactsTruncated: false,
  };
}

/**
 * Reads a tar stream to the end (or to a cap) and sorts its entries into streams, report, result and
 * artifacts. Resolves when the archive is read or a cap is hit (`truncated`; the caller should then
 * stop the producer). Rejects only when the stream is not a tar archive or breaks.
 */
export function parseOutputTar(source: Readable, limits: OutputLimits): Promise<CollectedOutput> {
  const out = emptyOutput();
  const seen = new Set<string>();
  let totalBytes = 0;
  let entries = 0;
  const maxArtifacts = limits.maxArtifacts ?? MAX_ARTIFACT_ENTRIES;
  // Index in out.artifacts of the largest name, recomputed after a change (null: unknown).
  let largest: number | null = null;
  /**
   * Counts a new top-level entry; true when it gets a place in the list, evicting the largest name
   * kept if the list is full and this one sorts before it.
   */
  const admit = (name: string): boolean => {
    out.artifactsTotal++;
    const list = out.artifacts;
    if (list.length < maxArtifacts) {
      largest = null;
      return true;
    }
    if (largest === null) {
      largest = 0;
      for (let i = 1; i < list.length; i++) if (list[i]!.name > list[largest]!.name) largest = i;
    }
    if (!(name < list[largest]!.name)) return false;
    list.splice(largest, 1);
    largest = null;
    return true;
  };

  return new Promise<CollectedOutput>((resolve, reject) => {
    const extract = tar.extract();
    let settled = false;
    const finish = (err?: Error) => {
      if (settled) return;
      settled = true;
      source.unpipe(extract);
      // tar lists a directory in readdir order; the local runtime lists /output sorted by name.
      out.artifacts.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      out.artifactsTruncated = out.truncated || out.artifactsTotal > out.artifacts.length;
      if (err) reject(err);
      else resolve(out);
    };
    const stopAtCap = () => {
      out.truncated = true;
      finish();
      extract.destroy();
    };

    extract.on('entry', (header, stream, next) => {
      entries++;
      out.entries = entries;
      if (entries > limits.maxEntries) {
        stream.resume();
        stopAtCap();
        return;
      }
      const name = normalizeEntryName(header.name);
      const type = header.type ?? 'file';
      // Reads the entry, keeping at most `keep` bytes; hashes everything it reads.
      const read = (keep: number, onDone: (kept: Buffer, size: number, sha256: string) => void) => {
        const chunks: Buffer[] = [];
        let kept = 0;
        let size = 0;
        const hash = createHash('sha256');
        stream.on('data', (data: unknown) => {
          const chunk = data as Buffer;
          size += chunk.length;
          totalBytes += chunk.length;
          hash.update(chunk);
          if (kept < keep) {
            const part = chunk.subarray(0, keep - kept);
            chunks.push(part);
            kept += part.length;
          }
          if (totalBytes > limits.maxTotalBytes) {
            stream.destroy();
            stopAtCap();
          }
        });
        stream.on('end', () => {
          onDone(Buffer.concat(chunks), size, hash.digest('hex'));
          next();
        });
        stream.on('error', () => undefined);
      };
      const skip = () => {
        stream.on('end', () => next());
        stream.on('data', (data: unknown) => {
          const chunk = data as Buffer;
          totalBytes += chunk.length;
          if (totalBytes > limits.maxTotalBytes) {
            stream.destroy();
            stopAtCap();
          }
        });
        stream.resume();
      };

      if (typeof name !== 'string') {
        out.rejected.push(name);
        return skip();
      }
      if (name === '') return skip();
      // Artifacts are the files directly in /output, as on the local runtime: a subdirectory is
      // listed once as not kept, and nothing below it is read.
      // (A control file's or result.json's name is never an artifact, as on the local runtime.)
      const top = name.split('/')[0]!;
      if (type === 'directory' || top !== name) {
        if (!seen.has(top)) {
          seen.add(top);
          if (!NOT_ARTIFACTS.has(top) && admit(top)) {
            out.artifacts.push({ name: top, size: 0, sha256: EMPTY_SHA256, contentType: contentTypeFor(top), skipped: 'not_regular' });
          }
        }
        return skip();
      }
      if (seen.has(name)) return skip();
      seen.add(name);
      const topLevel = true;
      const regular = type === 'file' || type === 'contiguous-file';

      if (!regular) {
        // Links, devices, fifos: the archive holds no contents for them and a link could point
        // anywhere. Control files of this kind are treated as absent.
        if (!NOT_ARTIFACTS.has(name) && admit(name)) {
          out.artifacts.push({ name, size: 0, sha256: EMPTY_SHA256, contentType: contentTypeFor(name), skipped: 'not_regular' });
        }
        return skip();
      }
      if (topLevel && name in STREAM_FILES) {
        const which = STREAM_FILES[name as keyof typeof STREAM_FILES];
        return read(limits.maxStdoutBytes, (kept, size) => {
          out[which] = decodeText(kept);
          if (size > limits.maxStdoutBytes) {
            if (which === 'stdout') out.stdoutTruncated = true;
            else out.stderrTruncated = true;
          }
        });
      }
      if (topLevel && name === REPORT_FILE) {
        return read(MAX_REPORT_BYTES, (kept, size) => {
          out.report = size <= MAX_REPORT_BYTES ? parseRunnerReport(kept) : null;
        });
      }
      if (topLevel && name === PHASE_FILE) return skip();
      if (topLevel && name === RESULT_FILE) {
        return read(limits.maxArtifactBytes, (kept, size) => {
          if (size > limits.maxArtifactBytes) out.resultJsonTooLarge = true;
          else out.resultJson = decodeText(kept);
        });
      }
      // Past the limit an entry is only counted; its contents go by unread.
      if (!admit(name)) return skip();
      const reserved = topLevel && (RESERVED_ARTIFACT_NAMES as readonly string[]).includes(name);
      const tooLarge = header.size !== undefined && header.size > limits.maxArtifactBytes;
      return read(reserved || tooLarge ? 0 : limits.maxArtifactBytes, (kept, size, sha256) => {
        const file: CollectedFile = { name, size, sha256, contentType: contentTypeFor(name) };
        if (reserved) file.skipped = 'reserved_name';
        else if (tooLarge || size > limits.maxArtifactBytes) file.skipped = 'too_large';
        else file.data = kept;
        out.artifacts.push(file);
      });
    });
    extract.on('finish', () => finish());
    extract.on('close', () => finish());
    extract.on('error', (err: Error) => finish(settled ? undefined : err));
    source.on('error', (err: Error) => finish(err));
    source.pipe(extract);
  });
}
