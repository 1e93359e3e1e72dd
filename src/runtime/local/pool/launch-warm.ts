/**
 * The start of one warm sandbox (pool/sandbox-pool.ts): its run directory with the environment and
 * the egress proxy's directory mounted as for a cold run of its key, its cgroup, and the engine
 * running `runner.py --wait` (with the job type's `--preload`), started by a pre-forked spawner child
 * that entered the cgroup and dropped root. Nothing of a run is in it yet.
 * With a checkpoint image (gVisor) the engine restores the image instead of booting.
 *
 * Limits: the cgroup has the job type's memory and task limits from the start, but its CPU limit
 * only from the go ({@link warmStartLimits}; warm-entry.ts sets the run's limits before the go line):
 * until then only the runner and the job type's preloads run in it, and a restore (which loads the
 * checkpoint's memory on several threads) capped at a job type's one CPU took twice as long (2.0 s
 * against 1.1 s per refill, bench/sustained.ts's data type). The program never runs uncapped.
 */
import { availableParallelism } from 'node:os';
import path from 'node:path';
import { parseMemory } from '../../../config.ts';
import type { JobType } from '../../../jobtypes/job-type.ts';
import type { CgroupLimits, CgroupSupport, RunCgroup } from '../cgroups.ts';
import { RunDir, sandboxId } from '../runs/run-dir.ts';
import { runnerSandbox } from '../runs/runner-command.ts';
import { EGRESS_DIR, type SandboxHost } from '../sandbox.ts';
import type { SpawnedProc, Spawner } from '../spawner.ts';
import { WarmEgress } from './warm-egress.ts';
import { usesEgressProxy, type WarmEnv } from './warm-env.ts';

/** One job type kept warm, with one environment. */
export interface PoolTarget {
  jobType: JobType;
  interpreter: string;
  size: number;
  env: WarmEnv;
}

/** What {@link launchWarm} needs of the pool. */
export interface LaunchWarmOptions {
  cgroups: CgroupSupport;
  spawner: Spawner;
  host: SandboxHost;
  runsDir: string;
  /** Placeholder stream cap on the runner's command line (the go line sets the run's). */
  maxStreamBytes: number;
  limitsFor(jobType: JobType, memoryBytes: number): CgroupLimits;
  background(p: Promise<unknown>): void;
}

/** A started warm sandbox; `socketPath` is where its egress proxy is to listen ('' for none). */
export interface LaunchedWarm {
  rd: RunDir;
  cgroup: RunCgroup;
  proc: SpawnedProc;
  runscId: string | null;
  egress: boolean;
  socketPath: string;
  /** The run's limits, which the go sets (the start runs with {@link warmStartLimits}). */
  runLimits: CgroupLimits;
}

/** The limits a warm sandbox starts with: the run's, but CPU up to every core of the host (see the header). */
export function warmStartLimits(run: CgroupLimits, hostCpus: number): CgroupLimits {
  return { ...run, cpus: Math.max(run.cpus, hostCpus) };
}

/** Starts a warm sandbox of `t`, or says why it cannot (what it made is removed). */
export function launchWarm(o: LaunchWarmOptions, t: PoolTarget, now: number, restoreImage?: string): LaunchedWarm | { error: string } {
  const jt = t.jobType;
  const fail = (error: string) => ({ error });
  const memoryBytes = parseMemory(jt.memoryLimit);
  let rd: RunDir;
  let cgroup: RunCgroup;
  const runLimits = o.limitsFor(jt, memoryBytes);
  try {
    rd = RunDir.create({ host: o.host, runsDir: o.runsDir, id: sandboxId('w', now), program: 'later', tmpBytes: memoryBytes });
  } catch (err) {
    return fail(`cannot create its directory: ${(err as Error).message}`);
  }
  try {
    cgroup = o.cgroups.create(rd.id, warmStartLimits(runLimits, availableParallelism()));
  } catch (err) {
    rd.remove();
    return fail(`cannot create its cgroup: ${(err as Error).message}`);
  }
  // The environment and the proxy's directory are mounted as for a cold run of the key.
  if (t.env.dir) rd.mount({ type: 'ro', src: t.env.dir, dest: '/deps' });
  const egress = usesEgressProxy(jt);
  let socketPath = '';
  if (egress) {
    const sp = WarmEgress.socketPath(path.join(rd.dir, 'net'));
    if (typeof sp !== 'string') {
      o.background(cgroup.remove().then(() => rd.remove()));
      return fail(sp.error);
    }
    socketPath = sp;
    rd.mount({ type: 'ro', src: rd.subdir('net'), dest: EGRESS_DIR });
  }
  const spec = runnerSandbox({
    rd,
    interpreter: t.interpreter,
    runner: o.host.runnerFor(t.interpreter),
    jobType: jt,
    timeoutSec: jt.timeout,
    maxStreamBytes: o.maxStreamBytes,
    memoryBytes,
    fileSizeBytes: parseMemory(jt.maxFileSize),
    deps: t.env.dir !== null,
    egress,
    cgroups: true,
    inProcess: false,
    wait: true,
    preload: jt.preload,
    sh: o.host.waitingShell(),
    procsFiles: [],
  });
  // Restored (gVisor, restore-images.ts): the same spec as the checkpointed template's but for the
  // host directories of its mounts.
  const launch = o.host.launch(restoreImage ? { ...spec, restoreImage } : spec, true);
  // The go line and the runner's answers pass through named pipes in the run directory (outside
  // every mount), so no process stands between the service and the runner on a run's path.
  const fifos = { in: path.join(rd.dir, 'go.fifo'), out: path.join(rd.dir, 'out.fifo') };
  const proc = o.spawner.warm({ procsFiles: cgroup.procsFiles, fdFiles: launch.fdFiles, drop: o.host.privilegeDrop(), fifos });
  if (!proc) {
    o.background(cgroup.remove().then(() => rd.remove()));
    return fail('the spawner cannot start processes right now');
  }
  proc.launch({ file: launch.file, args: launch.args, env: launch.env, cwd: launch.cwd });
  return { rd, cgroup, proc, runscId: launch.runscId ?? null, egress, socketPath, runLimits };
}
