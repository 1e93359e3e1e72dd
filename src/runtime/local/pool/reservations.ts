/**
 * Reservations: while a run's record is being written, a warm sandbox is claimed for it and loaded
 * with its program, so the run itself only has to say go. Nothing runs in a reserved sandbox until
 * then; one whose run does not come within {@link RESERVATION_TTL_MS} is destroyed.
 */
import type { Logger } from '../../../logger.ts';
import type { RunSpec } from '../../runtime.ts';
import type { SandboxPool, WarmSandbox } from './sandbox-pool.ts';
import { poolKey, type WarmEnv } from './warm-env.ts';

/** A reserved warm sandbox whose run did not come within this long is given back (destroyed), ms. */
export const RESERVATION_TTL_MS = 10_000;

interface Reservation {
  w: WarmSandbox;
  key: string;
  code: string;
  inputJson: string;
  /** Names and digests of the input files delivered with it. */
  filesKey: string;
  timer: NodeJS.Timeout;
}

/** Options of {@link Reservations}. */
export interface ReservationsOptions {
  /** The pool in use now (null: none). */
  pool(): SandboxPool | null;
  log: Logger;
  background(p: Promise<unknown>): void;
}

/** Warm sandboxes reserved for runs whose records are being written, by execution id. */
export class Reservations {
  private readonly byId = new Map<string, Reservation>();

  constructor(private readonly o: ReservationsOptions) {}

  /** Claims and loads a sandbox for this run (a miss is not counted: the run's own claim is). */
  reserve(spec: RunSpec, interpreter: string, env: WarmEnv | null): void {
    const pool = this.o.pool();
    if (!pool || !env || this.byId.has(spec.executionId)) return;
    const w = pool.claim(spec.jobType, interpreter, env, false);
    if (!w || !this.deliver(w, spec)) return;
    const timer = setTimeout(() => this.unreserve(spec.executionId), RESERVATION_TTL_MS);
    timer.unref();
    this.byId.set(spec.executionId, { w, key: poolKey(spec.jobType, interpreter, env), code: spec.code, inputJson: spec.inputJson, filesKey: filesKey(spec), timer });
  }

  /** Destroys a reserved sandbox its run did not take (it ran nothing). */
  unreserve(executionId: string): void {
    const r = this.byId.get(executionId);
    if (!r) return;
    this.byId.delete(executionId);
    clearTimeout(r.timer);
    this.drop(r.w);
  }

  /** Gives every reservation back (the runtime stops). */
  clear(): void {
    for (const id of [...this.byId.keys()]) this.unreserve(id);
  }

  /** The sandbox reserved for this run, with this run's program in it; null when there is none (or it no longer fits). */
  take(spec: RunSpec, interpreter: string, env: WarmEnv | null): WarmSandbox | null {
    const r = this.byId.get(spec.executionId);
    if (!r) return null;
    this.byId.delete(spec.executionId);
    clearTimeout(r.timer);
    if (!env || r.key !== poolKey(spec.jobType, interpreter, env)) {
      this.drop(r.w);
      return null;
    }
    if (r.code !== spec.code || r.inputJson !== spec.inputJson || r.filesKey !== filesKey(spec)) return this.deliver(r.w, spec) ? r.w : null;
    return r.w;
  }

  /**
   * Writes the program and input into a claimed warm sandbox's run directory. When that fails (its
   * directory is gone or its disk full), the sandbox is destroyed and the run starts cold instead:
   * a broken warm sandbox is a miss, never the run's failure.
   */
  deliver(w: WarmSandbox, spec: RunSpec): boolean {
    try {
      w.rd.writeProgram({ code: spec.code, inputJson: spec.inputJson, inputFiles: spec.inputFiles });
      return true;
    } catch (err) {
      this.o.log.warn({ execution_id: spec.executionId, err: String(err) }, 'warm sandbox unusable; starting the run cold');
      this.drop(w);
      return false;
    }
  }

  private drop(w: WarmSandbox): void {
    this.o.background(w.destroy());
    setImmediate(() => this.o.pool()?.tick());
  }
}

/** The input files of a run as one comparable string (name and digest of each). */
function filesKey(spec: RunSpec): string {
  return JSON.stringify((spec.inputFiles ?? []).map((f) => [f.name, f.sha256]));
}
