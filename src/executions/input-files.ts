/**
 * Files for one-shot runs (issue 19): `input_files` (name → base64 in the request) and
 * `input_artifacts` (`[{job_id, name, as?}]`, artifacts of earlier jobs by reference) become the run's
 * `/input/files/<name>`, read-only. They are stored with the record as `artifacts` rows of kind
 * `input` (bytes included), so the record lists them (`input_artifacts`, with size and sha256), a
 * rerun or fork gets the same bytes, and a run of a record reads them back before it starts.
 *
 * Names are checked like artifact names (a plain file name: no separator, no NUL or control
 * character, not `.`/`..`), and also may not start with `..` (Kubernetes reserves such names in a
 * Secret volume) nor take the reserved `_code.py` / `_input.json`. Limits: {@link MAX_INPUT_FILES}
 * files, each at most `max_artifact_bytes`, all together at most {@link maxInputFilesTotal}; on the
 * Kubernetes runtime they also share the run Secret's room with the code and input.
 */
import { createHash } from 'node:crypto';
import type { Config } from '../config.ts';
import { KUBERNETES_MAX_PAYLOAD_BYTES } from '../config.ts';
import { AppError } from '../errors.ts';
import { contentTypeFor, RESERVED_ARTIFACT_NAMES } from '../runtime/run-output.ts';
import type { NewArtifact } from '../store/artifacts.repository.ts';
import { getArtifact, listInputFiles } from '../store/artifacts.repository.ts';
import type { Q } from '../store/executions.repository.ts';
import { canMatchText } from '../store/executions.repository.ts';

/** Most files one run gets under `/input/files/`. */
export const MAX_INPUT_FILES = 100;

/** Most bytes of all input files of one run together: four times `max_artifact_bytes`. */
export function maxInputFilesTotal(config: Pick<Config, 'max_artifact_bytes'>): number {
  return 4 * config.max_artifact_bytes;
}

/** A file a run gets under `/input/files/`. */
export interface InputFile {
  name: string;
  data: Buffer;
  sha256: string;
  contentType: string;
  /** Taken from an earlier job's artifact (`input_artifacts`). */
  source?: { executionId: string; name: string } | undefined;
}

/** A reference to an earlier job's artifact, as the request names it. */
export interface InputArtifactRef {
  job_id: string;
  name: string;
  /** The name under `/input/files/`; the artifact's own name when absent. */
  as?: string | undefined;
}

/** Why `name` is not an acceptable input file name, or null when it is. */
export function inputFileNameProblem(name: string): string | null {
  if (name.length === 0) return 'is empty';
  if (Buffer.byteLength(name, 'utf8') > 255) return 'is longer than 255 bytes';
  if (name === '.' || name === '..') return 'is a directory name';
  if (/[/\\]/.test(name)) return 'contains a path separator (only plain file names are accepted; no directories, no absolute paths)';
  if (/[\u0000-\u001f\u007f]/.test(name)) return 'contains a control character';
  if (name.startsWith('..')) return "starts with '..'";
  if ((RESERVED_ARTIFACT_NAMES as readonly string[]).includes(name)) return 'is reserved for the record\'s own inputs';
  return null;
}

/** Throws a 400 naming the field when `name` is not an acceptable input file name. */
export function checkInputFileName(field: string, name: string): void {
  const problem = inputFileNameProblem(name);
  if (problem) throw new AppError('validation_error', `${field}: file name ${JSON.stringify(name)} ${problem}`);
}

const STRICT_BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Decodes a base64 text strictly (Node's decoder skips what it does not know); null when it is not base64. */
export function decodeBase64(text: string): Buffer | null {
  const t = text.replace(/[\r\n]/g, '');
  return STRICT_BASE64.test(t) ? Buffer.from(t, 'base64') : null;
}

function fileOf(name: string, data: Buffer, source?: InputFile['source']): InputFile {
  return { name, data, sha256: createHash('sha256').update(data).digest('hex'), contentType: contentTypeFor(name), source };
}

/**
 * The files a submission asks for, checked and resolved: the inline ones decoded, the referenced
 * artifacts read from the store. Throws 400 (bad name, bad base64, duplicate, over a limit) or 404
 * (no such job or artifact).
 */
export async function resolveInputFiles(
  db: Q,
  config: Pick<Config, 'max_artifact_bytes' | 'runtime' | 'max_code_bytes' | 'max_input_bytes'>,
  inline: Record<string, string> | undefined,
  refs: readonly InputArtifactRef[] | undefined,
): Promise<InputFile[]> {
  const files: InputFile[] = [];
  const seen = new Set<string>();
  const add = (field: string, f: InputFile) => {
    if (seen.has(f.name)) throw new AppError('validation_error', `${field}: two input files are named ${JSON.stringify(f.name)}`);
    seen.add(f.name);
    if (f.data.length > config.max_artifact_bytes) {
      throw new AppError('validation_error', `${field}: file ${JSON.stringify(f.name)} is ${f.data.length} bytes, over max_artifact_bytes (${config.max_artifact_bytes})`);
    }
    files.push(f);
  };
  for (const [name, text] of Object.entries(inline ?? {})) {
    checkInputFileName('input_files', name);
    const data = decodeBase64(text);
    if (!data) throw new AppError('validation_error', `input_files: the content of ${JSON.stringify(name)} is not base64`);
    add('input_files', fileOf(name, data));
  }
  for (const [i, ref] of (refs ?? []).entries()) {
    const field = `input_artifacts[${i}]`;
    const as = ref.as ?? ref.name;
    checkInputFileName(field, as);
    const a = canMatchText(ref.job_id) && canMatchText(ref.name) ? await getArtifact(db, ref.job_id, ref.name, true) : undefined;
    if (!a?.data) throw new AppError('not_found', `${field}: job '${ref.job_id}' has no artifact named ${JSON.stringify(ref.name)}`);
    add(field, fileOf(as, Buffer.from(a.data), { executionId: ref.job_id, name: ref.name }));
  }
  if (files.length > MAX_INPUT_FILES) throw new AppError('validation_error', `input_files and input_artifacts: at most ${MAX_INPUT_FILES} files, got ${files.length}`);
  const total = files.reduce((n, f) => n + f.data.length, 0);
  if (total > maxInputFilesTotal(config)) {
    throw new AppError('validation_error', `input_files and input_artifacts: ${total} bytes together, over ${maxInputFilesTotal(config)} (4 × max_artifact_bytes)`);
  }
  // The Kubernetes runtime hands code, input and files to the pod in one Secret (1 MiB in etcd).
  const room = KUBERNETES_MAX_PAYLOAD_BYTES - config.max_code_bytes - config.max_input_bytes;
  if (config.runtime === 'kubernetes' && total > room) {
    throw new AppError('validation_error', `input_files and input_artifacts: ${total} bytes together, over the ${room} bytes a run Secret has room for on the Kubernetes runtime`);
  }
  return files.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** The artifacts rows that keep a record's input files. */
export function inputFileArtifacts(executionId: string, files: readonly InputFile[]): NewArtifact[] {
  return files.map((f) => ({
    executionId,
    kind: 'input',
    name: f.name,
    sizeBytes: f.data.length,
    sha256: f.sha256,
    contentType: f.contentType,
    data: f.data,
    skipped: null,
    source: f.source,
  }));
}

/** A record's input files as stored (for its run, a rerun or a fork). */
export async function loadInputFiles(db: Q, executionId: string): Promise<InputFile[]> {
  const rows = await listInputFiles(db, executionId);
  return rows.map((r) => ({
    name: r.name,
    // PGlite hands bytea back as a Uint8Array, PostgreSQL as a Buffer.
    data: r.data ? Buffer.from(r.data) : Buffer.alloc(0),
    sha256: r.sha256,
    contentType: r.content_type,
    source: r.source_execution_id ? { executionId: r.source_execution_id, name: r.source_name ?? r.name } : undefined,
  }));
}

/** What the idempotency payload hash takes of the files: names and digests, in name order. */
export function filesDigest(files: readonly InputFile[]): { name: string; sha256: string }[] {
  return files.map((f) => ({ name: f.name, sha256: f.sha256 }));
}
