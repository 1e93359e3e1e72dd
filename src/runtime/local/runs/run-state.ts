/**
 * What the local runtime's run steps share: the runtime's prepared machinery ({@link Prepared}), the
 * runtime's own services a step calls ({@link RunContext}), and one run's state between its steps
 * ({@link RunState}). Types only.
 */
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { Logger } from '../../../logger.ts';
import type { RunObservation, RunOptions, RunSpec } from '../../runtime.ts';
import type { LocalBuilder } from '../builds/build.ts';
import type { DepsCache } from '../builds/deps.ts';
import type { InstallContext } from '../builds/install-sandbox.ts';
import type { CgroupSupport, RunCgroup } from '../cgroups.ts';
import type { EngineName } from '../engines.ts';
import type { SandboxPool } from '../pool/sandbox-pool.ts';
import type { Warm, WarmPool } from '../pool/warm-pool.ts';
import type { SandboxHost } from '../sandbox.ts';
import type { Spawner } from '../spawner.ts';
import type { EgressProxy } from './egress-proxy.ts';
import type { RunDir } from './run-dir.ts';

/** What start() prepared; null before start and after stop. */
export interface Prepared {
  engine: EngineName;
  host: SandboxHost;
  cgroups: CgroupSupport | null;
  deps: DepsCache;
  runsDir: string;
  runsTmpfs: boolean;
  /** Forks the warm children (with cgroups only: they exist to enter a run's cgroups early). */
  spawner: Spawner | null;
  warm: WarmPool | null;
  /** Warm sandboxes per job type (with cgroups and a real engine only; see pool/sandbox-pool.ts). */
  sandboxes: SandboxPool | null;
}

/** The runtime's services the run steps use. */
export interface RunContext {
  config: Config;
  clock: Clock;
  log: Logger;
  builder: LocalBuilder;
  runsc: string | null;
  installContext(p: Prepared): InstallContext;
  /** Runs a promise after the fact (cleanups), logging its failure. */
  background(p: Promise<unknown>): void;
}

/** One run's state between the steps of a run. */
export interface RunState {
  spec: RunSpec;
  options: RunOptions;
  p: Prepared;
  interpreter: string;
  t0: number;
  obs: RunObservation;
  rd: RunDir;
  depsDir: string | null;
  egress: EgressProxy | null;
  warm: Warm | null;
  cgroup: RunCgroup | null;
}
