/**
 * Proving a sandbox engine works on this machine by running `print(1)` through it: the start-up
 * choice of engine ({@link chooseEngine}), the detection `make bench` and tools use
 * ({@link detectEngines}), and the bare floor ({@link measureBareFloor}: the engine's own cost, no
 * service around it). All three build hosts and run directories exactly as a real run does.
 */
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { systemClock, type Clock } from '../../clock.ts';
import type { Config } from '../../config.ts';
import type { Logger } from '../../logger.ts';
import { RUNNER_PATH } from '../../sandbox/paths.ts';
import { candidateEngines, engineInstalled, findEngineBinaries, type EngineBinaries, type EngineName } from './engines.ts';
import { execOut, killGroup, runscDelete, spawnProc } from './runs/proc.ts';
import { RunDir, sandboxId } from './runs/run-dir.ts';
import { programEnv, SANDBOX_NOFILE } from './runs/runner-command.ts';
import { SandboxHost } from './sandbox.ts';
import { compileSeccompBpf } from './seccomp.ts';
import { instanceRoot } from './workspace.ts';

/** The interpreter for probes and the spawner: the configured 3.11, else the first configured. */
export function defaultInterpreter(config: Pick<Config, 'python_interpreters'>): string {
  const interp = config.python_interpreters['3.11'] ?? Object.values(config.python_interpreters)[0];
  if (!interp) throw new Error('python_interpreters is empty');
  return interp;
}

/**
 * The prepared host of one engine under `root/<engine>`: read-only binds for interpreter prefixes
 * outside /usr and local find-links directories, the seccomp filter for bubblewrap when enabled.
 */
export function createSandboxHost(config: Config, bins: EngineBinaries, root: string, engine: EngineName): SandboxHost {
  const extraRo = new Set<string>();
  for (const interp of Object.values(config.python_interpreters)) {
    // Interpreters outside /usr need their prefix (bin/..) visible too.
    if (!interp.startsWith('/usr/')) extraRo.add(path.dirname(path.dirname(interp)));
  }
  for (const fl of config.pip.find_links) {
    const dir = localFindLinks(fl);
    if (dir && existsSync(dir)) extraRo.add(path.resolve(dir));
  }
  return new SandboxHost(
    {
      engine,
      bins,
      root: path.join(root, engine),
      runnerSource: RUNNER_PATH,
      seccomp: config.enable_seccomp,
      gvisorPlatform: config.gvisor_platform,
      extraRo: [...extraRo],
    },
    config.enable_seccomp && engine === 'bubblewrap' ? compileSeccompBpf() : null,
  );
}

/**
 * One bare run of `print(1)` through an engine: the same mounts and sandbox options as a real run,
 * but no runner, no cgroups, no dependency step and no output collection.
 */
async function floorOnce(host: SandboxHost, runsDir: string, interpreter: string, tag: string, timeoutMs: number, clock: Clock): Promise<{ ok: boolean; ms: number; error: string }> {
  const rd = RunDir.create({ host, runsDir, id: sandboxId(tag, clock.now()), program: { code: 'print(1)\n', inputJson: '{}' }, tmpBytes: 512 * 1024 * 1024 });
  try {
    const t0 = performance.now();
    const launch = host.launch({
      id: rd.id,
      dir: rd.dir,
      argv: [interpreter, rd.at('/code/main.py')],
      env: programEnv([], {}, rd.at('/tmp')),
      cwd: '/tmp',
      mounts: rd.mounts,
      network: false,
      rlimits: { nofile: SANDBOX_NOFILE },
      procsFiles: [],
    });
    const proc = spawnProc(launch.file, launch.args, launch.env, launch.fdFiles, launch.cwd, false);
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => killGroup(proc), timeoutMs);
    proc.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString()));
    proc.child.stderr!.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4000)));
    const [code, , spawnError] = await proc.closed;
    clearTimeout(timer);
    if (spawnError) stderr += spawnError;
    const ms = performance.now() - t0;
    const ok = code === 0 && stdout === '1\n';
    return { ok, ms, error: ok ? '' : `exit ${code}, stdout ${JSON.stringify(stdout.slice(0, 200))}, stderr ${stderr.trim().slice(-1000)}` };
  } finally {
    rd.remove();
  }
}

/** Runs `print(1)` once through the engine; null when it printed 1, else why not. */
async function probe(host: SandboxHost, runsDir: string, interpreter: string, clock: Clock = systemClock): Promise<string | null> {
  try {
    const r = await floorOnce(host, runsDir, interpreter, 'probe', 30_000, clock);
    return r.ok ? null : r.error;
  } catch (err) {
    return (err as Error).message;
  }
}

/** Removes runsc containers an earlier process of this workspace left (their state is under the host's root). */
async function removeRunscOrphans(runsc: string, host: SandboxHost, log: Logger): Promise<void> {
  const ids = await execOut(runsc, ['--root', host.runscState, 'list', '-quiet']);
  const list = ids.split('\n').map((s) => s.trim()).filter(Boolean);
  if (list.length === 0) return;
  await runscDelete(runsc, host.runscState, list);
  log.info({ count: list.length }, 'removed orphaned runsc containers');
}

/** Options of {@link chooseEngine}. */
export interface ChooseEngineOptions {
  config: Config;
  bins: EngineBinaries;
  /** The instance root; each engine's host lives in `root/<engine>`. */
  root: string;
  runsDir: string;
  log: Logger;
  clock: Clock;
  /** Filled with why each engine tried and not chosen is unusable. */
  probeErrors: Partial<Record<EngineName, string>>;
}

/**
 * The engine a runtime starts with: the first of {@link candidateEngines} that is installed and runs
 * a probe. Compiles the runner for every configured interpreter and removes runsc orphans on the way.
 * Throws (with every engine's reason) when none works — in `strict` mode, when gVisor does not.
 */
export async function chooseEngine(o: ChooseEngineOptions): Promise<{ engine: EngineName; host: SandboxHost }> {
  const { config } = o;
  const candidates = candidateEngines(config);
  if (candidates.length === 0) {
    throw new Error(`sandbox_engine ${config.sandbox_engine} is not allowed in security_mode ${config.security_mode}`);
  }
  for (const engine of candidates) {
    if (!engineInstalled(engine, o.bins)) {
      o.probeErrors[engine] = `${engine === 'gvisor' ? config.container_runtime || 'runsc' : 'bwrap'} not found`;
      continue;
    }
    const host = createSandboxHost(config, o.bins, o.root, engine);
    for (const interp of Object.values(config.python_interpreters)) if (existsSync(interp)) host.runnerFor(interp);
    if (engine === 'gvisor') await removeRunscOrphans(o.bins.runsc!, host, o.log);
    const err = await probe(host, o.runsDir, defaultInterpreter(config), o.clock);
    if (err === null) return { engine, host };
    o.probeErrors[engine] = err;
    o.log.warn({ engine, err }, 'sandbox engine does not work here');
  }
  const why = Object.entries(o.probeErrors).map(([e, m]) => `${e}: ${m}`).join('; ');
  if (config.security_mode === 'strict') throw new Error(`security_mode strict requires gVisor (runsc), which is not usable: ${why}`);
  throw new Error(`no usable sandbox engine for sandbox_engine=${config.sandbox_engine}: ${why}`);
}

/** Engines on this machine: installed and proven to run `print(1)`; `chosen` is what start() would pick. */
export interface EngineDetection {
  engines: Record<EngineName, { installed: boolean; works: boolean; error?: string }>;
  chosen: EngineName | null;
}

/** Detects which engines work (runs one tiny sandbox per installed engine). */
export async function detectEngines(config: Config): Promise<EngineDetection> {
  const bins = findEngineBinaries(config);
  const probeRoot = path.join(instanceRoot(config).root, 'detect');
  const runsDir = path.join(probeRoot, 'runs');
  mkdirSync(runsDir, { recursive: true, mode: 0o755 });
  const interpreter = defaultInterpreter(config);
  const engines = {} as EngineDetection['engines'];
  for (const engine of ['gvisor', 'bubblewrap', 'process'] as const) {
    const installed = engineInstalled(engine, bins);
    if (!installed) {
      engines[engine] = { installed, works: false, error: 'not installed' };
      continue;
    }
    const err = await probe(createSandboxHost(config, bins, probeRoot, engine), runsDir, interpreter);
    engines[engine] = err === null ? { installed, works: true } : { installed, works: false, error: err };
  }
  const chosen = candidateEngines(config).find((e) => engines[e].works) ?? null;
  return { engines, chosen };
}

/** Options of {@link measureBareFloor}. */
export interface BareFloorOptions {
  /** Engine to measure (default: what `sandbox_engine`/`security_mode` would pick). */
  engine?: EngineName;
  iterations?: number;
  /** Interpreter (default: the configured one for 3.11, else the first configured). */
  interpreter?: string;
}

/**
 * The bare floor for `make bench`: runs `print(1)` through the engine directly — same sandbox
 * options and mounts as a real run, no service, no runner, no cgroups — `iterations` times in a row
 * and returns each wall time in milliseconds. Throws when the engine does not print `1`.
 * Uses its own directory under the workspace, so it can run next to a started runtime.
 */
export async function measureBareFloor(config: Config, options: BareFloorOptions = {}): Promise<number[]> {
  const engine = options.engine ?? (await detectEngines(config)).chosen;
  if (!engine) throw new Error('no usable sandbox engine');
  const interpreter = options.interpreter ?? defaultInterpreter(config);
  const floorRoot = path.join(instanceRoot(config).root, 'floor');
  const host = createSandboxHost(config, findEngineBinaries(config), floorRoot, engine);
  const runsDir = path.join(floorRoot, 'runs');
  mkdirSync(runsDir, { recursive: true, mode: 0o755 });
  const times: number[] = [];
  for (let i = 0; i < (options.iterations ?? 1); i++) {
    const r = await floorOnce(host, runsDir, interpreter, 'floor', 60_000, systemClock);
    if (!r.ok) throw new Error(`bare ${engine} run failed: ${r.error}`);
    times.push(r.ms);
  }
  return times;
}

/** The host directory of a `find_links` entry that is one (a path or a `file://` URL), else null. */
function localFindLinks(fl: string): string | null {
  if (fl.startsWith('/')) return fl;
  if (!fl.startsWith('file://')) return null;
  try {
    return fileURLToPath(fl);
  } catch {
    return null;
  }
}
