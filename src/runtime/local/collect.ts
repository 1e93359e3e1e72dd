/**
 * Reads what a run left in its `/output` directory, as root on the host, without trusting any of it.
 *
 * Everything in there was written by user code, so: files are opened with O_NOFOLLOW|O_NONBLOCK and
 * checked to be regular files on the opened descriptor (a symlink to /etc/shadow or a FIFO gets
 * nowhere), reads are capped, and names are taken as they are.
 *
 * Decision on subdirectories: they are not descended into. A subdirectory, like a symlink or any other
 * non-regular entry, is listed as an artifact with `skipped: 'not_regular'` and no data, so the caller
 * can tell the user it was there. At most {@link MAX_ARTIFACT_ENTRIES} entries are looked at.
 */
import { createHash } from 'node:crypto';
import { closeSync, constants, fstatSync, lstatSync, openSync, readdirSync, readSync } from 'node:fs';
import path from 'node:path';
import { CONTROL_FILES, RESERVED_ARTIFACT_NAMES, type CollectedFile, type RunnerReport } from '../runtime.ts';

/** Entries of /output looked at; the rest are ignored. */
export const MAX_ARTIFACT_ENTRIES = 1000;
const REPORT_CAP = 64 * 1024;

const CONTENT_TYPES: Record<string, string> = {
  '.json': 'application/json',
  '.txt': 'text/plain; charset=utf-8',
  '.log': 'text/plain; charset=utf-8',
  '.md': 'text/markdown; charset=utf-8',
  '.csv': 'text/csv; charset=utf-8',
  '.tsv': 'text/tab-separated-values; charset=utf-8',
  '.html': 'text/html; charset=utf-8',
  '.htm': 'text/html; charset=utf-8',
  '.xml': 'application/xml',
  '.yaml': 'application/yaml',
  '.yml': 'application/yaml',
  '.py': 'text/x-python; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.png': 'image/png',
  '.jpg': 'image/jpeg',
  '.jpeg': 'image/jpeg',
  '.gif': 'image/gif',
  '.svg': 'image/svg+xml',
  '.webp': 'image/webp',
  '.bmp': 'image/bmp',
  '.ico': 'image/x-icon',
  '.pdf': 'application/pdf',
  '.zip': 'application/zip',
  '.gz': 'application/gzip',
  '.tar': 'application/x-tar',
  '.parquet': 'application/vnd.apache.parquet',
  '.npy': 'application/octet-stream',
  '.pkl': 'application/octet-stream',
  '.wav': 'audio/wav',
  '.mp3': 'audio/mpeg',
  '.mp4': 'video/mp4',
};

/** MIME type from a file name's extension; `application/octet-stream` when unknown. */
export function contentTypeFor(name: string): string {
  return CONTENT_TYPES[path.extname(name).toLowerCase()] ?? 'application/octet-stream';
}

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

/** The runner's report, parsed; null when absent, too large or not a JSON object. */
export function readReport(outputDir: string): RunnerReport | null {
  const f = readRegularFile(path.join(outputDir, '.svc_report.json'), REPORT_CAP);
  if (!f || f.tooLarge) return null;
  try {
    const v = JSON.parse(f.data.toString('utf8')) as unknown;
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as RunnerReport) : null;
  } catch {
    return null;
  }
}

/** A captured stream: text capped at `cap` bytes, truncated when the file was longer. */
export function readStream(outputDir: string, name: '.svc_stdout' | '.svc_stderr', cap: number): { text: string; truncated: boolean } {
  const f = readRegularFile(path.join(outputDir, name), cap);
  if (!f) return { text: '', truncated: false };
  return { text: new TextDecoder('utf-8').decode(f.data), truncated: f.tooLarge };
}

/** `result.json` text and the artifacts of an output directory. */
export function collectOutputs(outputDir: string, maxArtifactBytes: number): { resultJson: string | null; resultJsonTooLarge: boolean; artifacts: CollectedFile[] } {
  let entries: string[];
  try {
    entries = readdirSync(outputDir);
  } catch {
    return { resultJson: null, resultJsonTooLarge: false, artifacts: [] };
  }
  const control = new Set<string>(CONTROL_FILES);
  const reserved = new Set<string>(RESERVED_ARTIFACT_NAMES);
  let resultJson: string | null = null;
  let resultJsonTooLarge = false;
  const artifacts: CollectedFile[] = [];
  for (const name of entries.sort().slice(0, MAX_ARTIFACT_ENTRIES)) {
    if (control.has(name)) continue;
    const file = path.join(outputDir, name);
    if (name === 'result.json') {
      const f = readRegularFile(file, maxArtifactBytes);
      if (f) {
        resultJsonTooLarge = f.tooLarge;
        resultJson = f.tooLarge ? null : f.data.toString('utf8');
      }
      continue;
    }
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
  return { resultJson, resultJsonTooLarge, artifacts };
}
