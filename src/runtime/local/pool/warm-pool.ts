/**
 * Warm processes (cgroups only): pre-forked children of the spawner, each already in a fresh cgroup
 * of its own and with root dropped, waiting for one run's command. Moving a process between cgroups
 * costs a kernel RCU grace period (~10 ms here); a warm process takes that off a run's critical
 * path. Each is used once, then replaced.
 */
import type { Clock } from '../../../clock.ts';
import type { Logger } from '../../../logger.ts';
import type { CgroupSupport, RunCgroup } from '../cgroups.ts';
import { sandboxId } from '../runs/run-dir.ts';
import type { SandboxHost } from '../sandbox.ts';
import type { SpawnedProc, Spawner } from '../spawner.ts';

/** A warm process and the cgroup it waits in; the run that takes it sets the cgroup's limits. */
export interface Warm {
  proc: SpawnedProc;
  cgroup: RunCgroup;
}

/** Limits of a waiting process's cgroup until a run sets its own. */
const WAITING_LIMITS = { memoryBytes: 256 * 1024 * 1024, pids: 16, cpus: 1 } as const;

/** Options of {@link WarmPool}. */
export interface WarmPoolOptions {
  cgroups: CgroupSupport;
  spawner: Spawner;
  host: SandboxHost;
  /** How many to keep waiting. */
  target: number;
  clock: Clock;
  log: Logger;
  /** Runs housekeeping off the caller's path. */
  background(p: Promise<unknown>): void;
}

/** Keeps `target` warm processes waiting; `take()` hands one out, `refill()` replaces it. */
export class WarmPool {
  private readonly warm: Warm[] = [];
  private stopped = false;

  constructor(private readonly o: WarmPoolOptions) {}

  /** Starts warm processes until `target` wait (or the spawner cannot start one right now). */
  refill(): void {
    const o = this.o;
    while (!this.stopped && this.warm.length < o.target) {
      let cgroup: RunCgroup;
      try {
        cgroup = o.cgroups.create(sandboxId('w', o.clock.now()), WAITING_LIMITS);
      } catch (err) {
        o.log.warn({ err }, 'cannot create a cgroup for a warm sandbox shell');
        return;
      }
      const proc = o.spawner.warm({ procsFiles: cgroup.procsFiles, fdFiles: o.host.fdFiles(), drop: o.host.privilegeDrop() });
      if (!proc) {
        o.background(cgroup.remove());
        return;
      }
      const w: Warm = { proc, cgroup };
      this.warm.push(w);
      void proc.closed.then(() => {
        // Died while waiting (spawner restart, stop): drop it and its cgroup.
        const i = this.warm.indexOf(w);
        if (i >= 0) {
          this.warm.splice(i, 1);
          o.background(cgroup.remove());
        }
      });
    }
  }

  /** A waiting process, now the caller's (its cgroup too); null when none waits. */
  take(): Warm | null {
    return this.warm.shift() ?? null;
  }

  /** Kills every waiting process and removes its cgroup; no more are started. */
  stop(): void {
    this.stopped = true;
    for (const w of this.warm.splice(0)) {
      w.proc.kill();
      this.o.background(w.proc.closed.then(() => w.cgroup.remove()));
    }
  }
}
