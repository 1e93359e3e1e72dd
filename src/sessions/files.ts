/**
 * The files API of a session (issue 19): files in its working directory (`/workspace`, the cells'
 * current directory), read and written by the service on the host side of the bind mount. The
 * directory is writable by the session's code, so nothing in it is trusted: names are plain file
 * names (checked like artifact names), every open is `O_NOFOLLOW` (a link a cell planted is refused,
 * never followed out) and must be a regular file, and sizes are capped by `max_artifact_bytes`.
 * Written files belong to the sandbox user, so later cells can change them.
 */
import { createHash } from 'node:crypto';
import { closeSync, constants as C, fchownSync, fstatSync, lstatSync, openSync, readdirSync, readSync, unlinkSync, writeSync } from 'node:fs';
import path from 'node:path';
import { AppError } from '../errors.ts';
import { contentTypeFor } from '../runtime/run-output.ts';
import type { SessionFiles, WorkspaceEntry } from '../runtime/session.ts';

const SANDBOX_UID = 1000;
const SANDBOX_GID = 1000;

export type { WorkspaceEntry };

/** The files API on a host directory (the local runtime's `workspaceDir`), as {@link SessionFiles}. */
export function hostWorkspaceFiles(dir: string): SessionFiles {
  return {
    list: async () => listWorkspace(dir),
    read: async (name, maxBytes, withData) => readWorkspaceFile(dir, name, maxBytes, withData),
    write: async (name, data, maxBytes) => writeWorkspaceFile(dir, name, data, maxBytes),
    remove: async (name) => deleteWorkspaceFile(dir, name),
  };
}

/** Throws a 400 unless `name` is a plain file name (no separator, no `..`, no control character). */
export function checkFileName(name: string): void {
  let problem: string | null = null;
  if (name.length === 0) problem = 'is empty';
  else if (Buffer.byteLength(name, 'utf8') > 255) problem = 'is longer than 255 bytes';
  else if (name === '.' || name === '..') problem = 'is a directory name';
  else if (/[/\\]/.test(name)) problem = 'contains a path separator (only plain file names: no directories, no absolute paths)';
  else if (/[\u0000-\u001f\u007f]/.test(name)) problem = 'contains a control character';
  if (problem) throw new AppError('bad_request', `invalid file name ${JSON.stringify(name)}: it ${problem}`);
}

function openNoFollow(file: string, flags: number, mode?: number): number {
  try {
    return openSync(file, flags | C.O_NOFOLLOW | C.O_NONBLOCK, mode);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new AppError('not_found', `no file named ${JSON.stringify(path.basename(file))} in the session's workspace`);
    if (code === 'ELOOP' || code === 'EISDIR' || code === 'ENXIO') throw new AppError('conflict', `${JSON.stringify(path.basename(file))} in the session's workspace is not a regular file (links are not followed)`);
    throw err;
  }
}

/** Reads a workspace file: its bytes, sha256 and content type (404, 409 for a non-file, 413 over the cap). */
export function readWorkspaceFile(dir: string, name: string, maxBytes: number, withData: boolean): { data: Buffer | null; size: number; sha256: string; contentType: string } {
  checkFileName(name);
  const fd = openNoFollow(path.join(dir, name), C.O_RDONLY);
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new AppError('conflict', `${JSON.stringify(name)} in the session's workspace is not a regular file`);
    if (st.size > maxBytes) throw new AppError('payload_too_large', `${JSON.stringify(name)} is ${st.size} bytes, over max_artifact_bytes (${maxBytes})`);
    const buf = Buffer.alloc(st.size);
    let off = 0;
    while (off < buf.length) {
      const n = readSync(fd, buf, off, buf.length - off, off);
      if (n === 0) break;
      off += n;
    }
    const data = buf.subarray(0, off);
    return { data: withData ? data : null, size: off, sha256: createHash('sha256').update(data).digest('hex'), contentType: contentTypeFor(name) };
  } finally {
    closeSync(fd);
  }
}

/** Writes a workspace file (replacing a regular file of that name); owned by the sandbox user. */
export function writeWorkspaceFile(dir: string, name: string, data: Buffer, maxBytes: number): { size: number; sha256: string; created: boolean } {
  checkFileName(name);
  if (data.length > maxBytes) throw new AppError('payload_too_large', `the file is ${data.length} bytes, over max_artifact_bytes (${maxBytes})`);
  const file = path.join(dir, name);
  let created = true;
  try {
    created = !lstatSync(file).isFile();
  } catch {
    /* absent: created */
  }
  const fd = openNoFollow(file, C.O_WRONLY | C.O_CREAT | C.O_TRUNC, 0o644);
  try {
    if (!fstatSync(fd).isFile()) throw new AppError('conflict', `${JSON.stringify(name)} in the session's workspace is not a regular file`);
    let off = 0;
    while (off < data.length) off += writeSync(fd, data, off, data.length - off);
    if (process.getuid?.() === 0) fchownSync(fd, SANDBOX_UID, SANDBOX_GID);
  } finally {
    closeSync(fd);
  }
  return { size: data.length, sha256: createHash('sha256').update(data).digest('hex'), created };
}

/** Removes a workspace file (a link is removed itself, never followed); 404 when there is none. */
export function deleteWorkspaceFile(dir: string, name: string): void {
  checkFileName(name);
  const file = path.join(dir, name);
  let st;
  try {
    st = lstatSync(file);
  } catch {
    throw new AppError('not_found', `no file named ${JSON.stringify(name)} in the session's workspace`);
  }
  if (st.isDirectory()) throw new AppError('conflict', `${JSON.stringify(name)} is a directory`);
  unlinkSync(file);
}

/** The regular files at the top of the workspace, by name (links and directories are not listed). */
export function listWorkspace(dir: string): WorkspaceEntry[] {
  const out: WorkspaceEntry[] = [];
  for (const name of readdirSync(dir).sort().slice(0, 10_000)) {
    try {
      const st = lstatSync(path.join(dir, name));
      if (st.isFile()) out.push({ name, size_bytes: st.size, modified_at: st.mtime.toISOString() });
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}
