/**
 * The one way a local session sandbox starts (issue 19), for a session's own start and for the session
 * pool's (session-pool.ts) alike: its requirements made available (session-deps.ts), then
 * `LocalSessionSandbox.start` with the runtime's host, cgroups, spawner and the job type's limits. The
 * isolation of a pooled sandbox is therefore a session sandbox's by construction.
 */
import { sessionPoolSizes } from '../../../config.ts';
import { FileJobTypeRegistry, type JobType } from '../../../jobtypes/job-type.ts';
import type { SessionOpenOptions } from '../../session.ts';
import { sandboxInstaller } from '../builds/install-sandbox.ts';
import type { Prepared, RunContext } from '../runs/run-state.ts';
import { runLimits } from '../runs/steps.ts';
import { sessionDeps } from './session-deps.ts';
import { SessionPool } from './session-pool.ts';
import { LocalSessionSandbox } from './session-sandbox.ts';

/** What {@link startSessionSandbox} needs of the local runtime: the part of a run's context it uses. */
export type StartSessionContext = Pick<RunContext, 'config' | 'clock' | 'log' | 'builder' | 'runsc' | 'installContext'>;

/** Starts a session sandbox of `jobType`; throws when sessions cannot run here or it could not start. */
export async function startSessionSandbox(c: StartSessionContext, p: Prepared, jobType: JobType, o: SessionOpenOptions): Promise<LocalSessionSandbox> {
  const interpreter = c.config.python_interpreters[jobType.pythonVersion];
  if (!interpreter) throw new Error(`no interpreter configured for python ${jobType.pythonVersion} (python_interpreters)`);
  if (!p.cgroups || !p.spawner || p.engine === 'process') throw new Error('sessions need cgroups and a real sandbox engine (gVisor or bubblewrap)');
  const { host, cgroups, spawner, runsDir } = p;
  const t0 = c.clock.now();
  const ctx = { builder: c.builder, config: c.config, clock: c.clock, deps: p.deps, install: sandboxInstaller(c.installContext(p), interpreter), interpreter };
  const depsDir = await sessionDeps(ctx, jobType, o.requirements ?? [], t0 + o.startupMs);
  const deps = { host, cgroups, spawner, runsDir, runsc: c.runsc, interpreter, log: c.log, now: () => c.clock.now() };
  const startupMs = Math.max(1000, o.startupMs - (c.clock.now() - t0));
  return LocalSessionSandbox.start({ ...deps, limitsFor: (jt, memoryBytes) => runLimits(host.engine, jt, memoryBytes, false) }, jobType, o.maxStreamBytes, startupMs, depsDir);
}

/** The session pool of `warm_pool.session_sizes` (session-pool.ts), where sessions can run (else null). */
export function newLocalSessionPool(c: StartSessionContext, p: Prepared): SessionPool | null {
  if (!p.cgroups || !p.spawner || p.engine === 'process' || c.config.max_sessions === 0) return null;
  const registry = new FileJobTypeRegistry(c.config);
  // A start that hangs holds the pool's one start slot: given up sooner than a session's own (300 s).
  const opts = { maxStreamBytes: c.config.max_stdout_bytes, startupMs: 120_000 };
  return new SessionPool({
    sizes: sessionPoolSizes(c.config),
    jobType: (name) => registry.get(name),
    idleMs: c.config.warm_pool.max_idle_sec * 1000,
    start: (jt) => startSessionSandbox(c, p, jt, { ...opts, requirements: jt.requirements }),
    now: () => c.clock.now(),
    log: c.log,
  });
}
