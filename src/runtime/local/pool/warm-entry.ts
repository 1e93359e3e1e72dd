/**
 * A warm sandbox as the pool holds it ({@link Entry}) and as a run gets it at the claim
 * ({@link WarmSandbox}, made by {@link handOver}): the runner's output so far is passed on, and from
 * then on the run's callbacks get it.
 */
import type { CgroupLimits, RunCgroup } from '../cgroups.ts';
import type { RunDir } from '../runs/run-dir.ts';
import type { RunProc, SpawnedProc } from '../spawner.ts';
import type { PoolTarget } from './launch-warm.ts';
import type { PoolEntryView } from './sandbox-pool-plan.ts';
import type { WarmEgress } from './warm-egress.ts';

/** A claimed sandbox: the run's now. */
export interface WarmSandbox {
  rd: RunDir;
  cgroup: RunCgroup;
  /** The engine process (stdout already past the runner's `ready` line). */
  proc: RunProc;
  runscId: string | null;
  /** CPU the cgroup used before the claim (interpreter and engine start), ms. */
  cpuBeforeMs: number;
  /** Binds the run to the sandbox's egress proxy (allowed_hosts types; nothing for others). Before go. */
  bind(executionId: string): void;
  /** Hands the program over: the run directory's files are written already; this sends the go line. */
  go(timeoutSec: number, maxStreamBytes: number, env?: Record<string, string>): void;
  /** Kills it and removes everything of it (background). */
  destroy(): Promise<void>;
}

export interface Entry extends PoolEntryView {
  target: PoolTarget;
  rd: RunDir;
  cgroup: RunCgroup;
  proc: SpawnedProc;
  runscId: string | null;
  /** The run's limits: set at the go (the sandbox started with launch-warm.ts's warmStartLimits). */
  runLimits: CgroupLimits;
  claimed: boolean;
  /** Booted; booted as the template of its key's checkpoint image; or restored from that image. */
  start: 'boot' | 'template' | 'restore';
  /** A template being checkpointed (it stops; its end is no failure). */
  checkpointing: boolean;
  /** The runner said `ready` (the entry is ready when its egress proxy, if any, listens too). */
  runnerReady: boolean;
  /** allowed_hosts types: the proxy, once it listens; `needsEgress` until then. */
  needsEgress: boolean;
  egress: WarmEgress | null;
  destroyed: boolean;
  stdout: string;
  stderrTail: string;
  out: ((b: Buffer) => void) | Buffer[];
  err: ((b: Buffer) => void) | Buffer[];
}

/** The sandbox, now the run's: its streams go to the run's callbacks from here on. */
export function handOver(e: Entry, destroy: () => Promise<void>): WarmSandbox {
  const route = (which: 'out' | 'err') => (cb: (b: Buffer) => void) => {
    const pending = e[which];
    e[which] = cb;
    if (Array.isArray(pending)) for (const b of pending) cb(b);
  };
  const cpuBeforeMs = e.cgroup.stats().cpuTimeMs ?? 0;
  return {
    rd: e.rd,
    cgroup: e.cgroup,
    runscId: e.runscId,
    cpuBeforeMs,
    proc: { onStdout: route('out'), onStderr: route('err'), kill: () => e.proc.kill(), closed: e.proc.closed },
    bind: (executionId) => e.egress?.bind(executionId, e.target.jobType.network.allowedHosts),
    go: (timeoutSec, maxStreamBytes, env = {}) => {
      // The run's CPU limit before the program exists (launch-warm.ts: the start ran without it).
      e.cgroup.setLimits(e.runLimits);
      e.proc.input(`${JSON.stringify({ timeout: timeoutSec, max_stream_bytes: maxStreamBytes, ...(Object.keys(env).length ? { env } : {}) })}\n`);
    },
    destroy,
  };
}
