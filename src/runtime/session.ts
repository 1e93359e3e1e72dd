/**
 * The session part of the runtime contract (issue 19; the rest is runtime.ts): what a runtime's
 * `openSession` gets and hands back. A session's sandbox is one session's only, never reused, with a
 * persistent interpreter; the service (src/sessions/) owns its record, expiry and files API, a runtime
 * only the sandbox: the local one on the host (runtime/local/session/), the Kubernetes one as a pod of
 * its own (runtime/kubernetes/session/).
 */
import { baseObservation, emptyRun } from './run-output.ts';
import type { RawRun } from './runtime.ts';

/** What a session's sandbox starts with. */
export interface SessionOpenOptions {
  maxStreamBytes: number;
  /** How long its start may take: installing its requirements and starting the interpreter, ms. */
  startupMs: number;
  /** Packages at `/deps` for every cell (the job type's, or the session's own); installed, or cached. */
  requirements?: readonly string[];
  /** The session's id: a cluster runtime labels the session's pod with it (adoption finds it so). */
  sessionId?: string;
  /** The session's lifetime, s: a cluster runtime bounds the pod by it. */
  lifetimeSec?: number;
}

/**
 * A runtime's ready session sandboxes of one job type (`/pool/stats` `sessions`, `/metrics`
 * `sandpod_session_pool_*`; sizing: runtime/session-pool-sizing.ts).
 */
export interface SessionPoolStats {
  job_type: string;
  /** Wanted ready sandboxes now: `warm_pool.session_sizes`, at least 1 while the type is used. */
  target: number;
  ready: number;
  starting: number;
  /**
   * Sessions of the type asking for no requirements beyond its own that got a ready sandbox (hits) or
   * started their own because none was ready (misses), since the start. Sessions with extra
   * requirements never take one and count as neither.
   */
  hits: number;
  misses: number;
}

/** The session's requirements could not be installed: the caller's to fix (pip's words in the message). */
export class SessionDependencyError extends Error {
  override readonly name = 'SessionDependencyError';
}

/** How a session's sandbox ended: closed by the service, crashed (a cell that ignored its interrupt, a dead interpreter), or OOM. */
export interface SessionEnd {
  reason: 'closed' | 'crashed' | 'oom';
  detail: string;
}

/**
 * What a cell gets when its session's sandbox has already ended as the cell is handed over (the end
 * came after the cell's record was written, e.g. an OOM kill of the pod between cells): nothing of it
 * ran, and it says how the sandbox ended, as a cell that was running then would (`oom`, else killed).
 * Not an error: a throw would count against the engine's breaker and be retried as an engine failure.
 */
export function cellAfterEnd(ended: SessionEnd, now: number): RawRun {
  return emptyRun(baseObservation(now, { exitCode: 137, oomKilled: ended.reason === 'oom', oomDetectable: true, phase: 'failed' }));
}

/** One cell of a session. */
export interface CellSpec {
  cell: number;
  code: string;
  inputJson: string;
  timeoutSec: number;
  maxStdoutBytes: number;
  maxArtifactBytes: number;
  onOutput?: ((stream: 'stdout' | 'stderr', chunk: Uint8Array) => void) | undefined;
  /** Set in the interpreter's environment for this cell (`runEnv`: TRACEPARENT); the last cell's are removed first. */
  env?: Record<string, string>;
}

/** A file of a session's `/workspace`, as listed. */
export interface WorkspaceEntry {
  name: string;
  size_bytes: number;
  modified_at: string;
}

/**
 * The files API of a session's `/workspace` (issue 19), wherever the files are. Every method takes
 * a plain file name (checked by the caller and again by the implementation), opens nothing through a
 * link, reads and writes regular files only, and throws `AppError`s: `bad_request` (the name),
 * `not_found`, `conflict` (a link, a directory, another non-file), `payload_too_large` (over `maxBytes`).
 */
export interface SessionFiles {
  /** The regular files at the top of the workspace, by name. */
  list(): Promise<WorkspaceEntry[]>;
  /** A file's bytes (null unless `withData`), size, sha256 and content type. */
  read(name: string, maxBytes: number, withData: boolean): Promise<{ data: Buffer | null; size: number; sha256: string; contentType: string }>;
  /** Writes (or replaces a regular file of that name); `created` when there was none. */
  write(name: string, data: Buffer, maxBytes: number): Promise<{ size: number; sha256: string; created: boolean }>;
  /** Removes a file (a link is removed itself, never followed). */
  remove(name: string): Promise<void>;
}

/** A session's sandbox, as a runtime hands it out. */
export interface SessionSandbox {
  /** Host path of the cells' working directory (`/workspace`), where the runtime has one. */
  readonly workspaceDir?: string;
  /** The workspace's files where they are not on this host (the service reads a `workspaceDir` itself). */
  readonly files?: SessionFiles;
  /**
   * Taken ready from the runtime's warm pool of session sandboxes (issue 19: "from the warm pool when one
   * is ready"), rather than started for this session.
   */
  readonly warm?: boolean;
  /** Runs one cell (one at a time); a crash or OOM during it resolves too, and ends the sandbox; on a sandbox already ended it resolves at once with {@link cellAfterEnd}. */
  runCell(c: CellSpec): Promise<RawRun>;
  /** How it ended; null while it lives. */
  readonly ended: SessionEnd | null;
  /** Called once when the sandbox ends. */
  onEnd(cb: (e: SessionEnd) => void): void;
  /** Kills it and removes its traces. */
  destroy(): Promise<void>;
  /** Lets go of it without ending it (its service stops; another process adopts it: `Runtime.adoptSession`). */
  release?(): void;
}
