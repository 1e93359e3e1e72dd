/**
 * Per-run cgroups for the local runtime: memory, process count and CPU limits, and the trusted
 * numbers read back after a run (OOM kills, peak memory, CPU time).
 *
 * cgroup v1 (one hierarchy per controller, as on this project's machines) and v2 (unified) are both
 * handled. Every run gets `<controller root>/sandpod/<instance>/<runId>`, where the instance is derived
 * from the workspace so that two services (or test files) on one machine never touch each other's runs; the sandbox's first process enters it
 * before it execs anything (see {@link RunCgroup.procsFiles}), so nothing the run starts escapes.
 * Everything here is synchronous: these are tiny writes to a kernel filesystem.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { rmdir } from 'node:fs/promises';
import path from 'node:path';

/** Limits for one run. */
export interface CgroupLimits {
  memoryBytes: number;
  /** Maximum number of tasks (processes and threads as the host kernel counts them). */
  pids: number;
  /** CPUs, e.g. 0.5 or 2. */
  cpus: number;
}

/** Trusted numbers of a finished run. */
export interface CgroupStats {
  oomKilled: boolean;
  maxRssMb?: number;
  cpuTimeMs?: number;
}

/** One run's cgroup(s). */
export interface RunCgroup {
  /** Files the sandbox's first process writes its pid to (`echo $$ > f` for each). */
  procsFiles: string[];
  /** Sets the limits (cheap; used when a pre-started process already sits in the group). */
  setLimits(limits: CgroupLimits): void;
  stats(): CgroupStats;
  /** Pids still in the cgroup. */
  pids(): number[];
  /** SIGKILLs everything in the cgroup. */
  killAll(): void;
  /**
   * SIGSTOPs everything in the cgroup: nothing in it runs or changes anything any more, and nothing
   * is torn down yet (that CPU work waits for {@link killAll}).
   */
  stopAll(): void;
  /** Removes the cgroup directories; retries briefly while the kernel is still reaping tasks. */
  remove(): Promise<void>;
}

/** What the machine offers. The parent groups are those of one instance (one workspace). */
export interface CgroupSupport {
  version: 1 | 2;
  /** v1: controller → directory of the `sandpod` parent group. v2: `unified` → the parent group. */
  parents: Record<string, string>;
  create(runId: string, limits: CgroupLimits): RunCgroup;
  /** Kills and removes the groups of earlier runs (orphans after a crash). Returns how many. */
  removeOrphans(): Promise<number>;
  /** Removes this instance's parent groups when no run group is left in them (at stop). */
  release(): Promise<void>;
}

const V1_CONTROLLERS = ['memory', 'pids', 'cpu', 'cpuacct'] as const;
const GROUP = 'sandpod';

function mounts(): { dir: string; type: string; opts: string[] }[] {
  try {
    return readFileSync('/proc/self/mounts', 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => l.split(' '))
      .map((f) => ({ dir: f[1] ?? '', type: f[2] ?? '', opts: (f[3] ?? '').split(',') }));
  } catch {
    return [];
  }
}

function tryWrite(file: string, value: string): boolean {
  try {
    writeFileSync(file, value);
    return true;
  } catch {
    return false;
  }
}

function readInt(file: string): number | undefined {
  try {
    const n = Number(readFileSync(file, 'utf8').trim());
    return Number.isFinite(n) ? n : undefined;
  } catch {
    return undefined;
  }
}

function readKeyed(file: string, key: string): number | undefined {
  try {
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      const [k, v] = line.split(/\s+/);
      if (k === key) return Number(v);
    }
  } catch {
    /* absent */
  }
  return undefined;
}

function pidsOf(dir: string): number[] {
  try {
    return readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

function killPids(pids: number[], signal: 'SIGKILL' | 'SIGSTOP' = 'SIGKILL'): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch {
      /* already gone */
    }
  }
}

async function rmdirRetry(dirs: string[]): Promise<void> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const left = dirs.filter((d) => existsSync(d));
    if (left.length === 0) return;
    for (const d of left) {
      killPids(pidsOf(d));
      try {
        // Async: removing a cgroup waits for an RCU grace period (milliseconds) — not on the event loop.
        await rmdir(d);
      } catch {
        /* busy: tasks still exiting */
      }
    }
    if (left.some((d) => existsSync(d))) await new Promise((r) => setTimeout(r, 20 * (attempt + 1)));
  }
}

/**
 * Detects usable cgroups (root with a writable hierarchy). Returns null when the machine does not
 * allow them; the runtime then falls back to rlimits and says so in health.
 */
export function detectCgroups(instance: string): CgroupSupport | null {
  const ms = mounts();
  const v1: Record<string, string> = {};
  for (const m of ms) {
    if (m.type !== 'cgroup') continue;
    for (const c of V1_CONTROLLERS) if (m.opts.includes(c) && !v1[c]) v1[c] = m.dir;
  }
  if (v1.memory && v1.pids && v1.cpu && v1.cpuacct) {
    const parents: Record<string, string> = {};
    for (const c of V1_CONTROLLERS) {
      const dir = path.join(v1[c]!, GROUP, instance);
      try {
        mkdirSync(dir, { recursive: true });
      } catch {
        return null;
      }
      parents[c] = dir;
    }
    const probe = path.join(parents.memory!, `probe-${process.pid}`);
    try {
      mkdirSync(probe);
      rmdirSync(probe);
    } catch {
      return null;
    }
    return v1Support(parents);
  }
  const unified = ms.find((m) => m.type === 'cgroup2' && m.dir === '/sys/fs/cgroup');
  if (unified) return v2Support(unified.dir, instance);
  return null;
}

function v1Support(parents: Record<string, string>): CgroupSupport {
  const dirsFor = (runId: string) => V1_CONTROLLERS.map((c) => path.join(parents[c]!, runId));
  return {
    version: 1,
    parents,
    create(runId, limits) {
      const [mem, pids, cpu, cpuacct] = dirsFor(runId) as [string, string, string, string];
      for (const d of [mem, pids, cpu, cpuacct]) mkdirSync(d, { recursive: true });
      tryWrite(path.join(mem, 'memory.swappiness'), '0');
      writeFileSync(path.join(cpu, 'cpu.cfs_period_us'), '100000');
      const setLimits = (l: CgroupLimits) => {
        // memsw must stay >= the memory limit at every step, so its order depends on the direction.
        const memsw = path.join(mem, 'memory.memsw.limit_in_bytes');
        tryWrite(memsw, String(Math.max(l.memoryBytes, readInt(path.join(mem, 'memory.limit_in_bytes')) ?? 0)));
        writeFileSync(path.join(mem, 'memory.limit_in_bytes'), String(l.memoryBytes));
        // No swap escape hatch where swap accounting exists.
        tryWrite(memsw, String(l.memoryBytes));
        writeFileSync(path.join(pids, 'pids.max'), String(l.pids));
        writeFileSync(path.join(cpu, 'cpu.cfs_quota_us'), String(Math.max(1000, Math.round(l.cpus * 100000))));
      };
      setLimits(limits);
      const all = [mem, pids, cpu, cpuacct];
      return {
        procsFiles: all.map((d) => path.join(d, 'cgroup.procs')),
        setLimits,
        stats() {
          const oom = readKeyed(path.join(mem, 'memory.oom_control'), 'oom_kill') ?? 0;
          const max = readInt(path.join(mem, 'memory.max_usage_in_bytes'));
          const cpuNs = readInt(path.join(cpuacct, 'cpuacct.usage'));
          return {
            oomKilled: oom > 0,
            ...(max !== undefined ? { maxRssMb: max / (1024 * 1024) } : {}),
            ...(cpuNs !== undefined ? { cpuTimeMs: Math.round(cpuNs / 1e6) } : {}),
          };
        },
        pids: () => [...new Set(all.flatMap(pidsOf))],
        killAll: () => killPids([...new Set(all.flatMap(pidsOf))]),
        // Every process of a run is in all four (it entered them together; only root can move it).
        stopAll: () => killPids(pidsOf(mem), 'SIGSTOP'),
        remove: () => rmdirRetry(all),
      };
    },
    async removeOrphans() {
      const runs = new Set<string>();
      for (const c of V1_CONTROLLERS) {
        for (const e of readdirSync(parents[c]!, { withFileTypes: true })) if (e.isDirectory()) runs.add(e.name);
      }
      await Promise.all([...runs].map((r) => rmdirRetry(dirsFor(r))));
      return runs.size;
    },
    release: () => removeIfEmpty(Object.values(parents)),
  };
}

/** rmdir of groups that may still hold children (then the kernel refuses, and they stay). */
async function removeIfEmpty(dirs: string[]): Promise<void> {
  await Promise.all(dirs.map((d) => rmdir(d).catch(() => undefined)));
}

function v2Support(root: string, instance: string): CgroupSupport | null {
  const parent = path.join(root, GROUP, instance);
  try {
    mkdirSync(parent, { recursive: true });
    // Controllers must be enabled on every level above the run groups.
    for (const dir of [root, path.join(root, GROUP), parent]) {
      const have = readFileSync(path.join(dir, 'cgroup.subtree_control'), 'utf8');
      for (const c of ['memory', 'pids', 'cpu']) if (!have.includes(c)) writeFileSync(path.join(dir, 'cgroup.subtree_control'), `+${c}`);
    }
  } catch {
    return null;
  }
  return {
    version: 2,
    parents: { unified: parent },
    create(runId, limits) {
      const dir = path.join(parent, runId);
      mkdirSync(dir, { recursive: true });
      tryWrite(path.join(dir, 'memory.swap.max'), '0');
      const setLimits = (l: CgroupLimits) => {
        writeFileSync(path.join(dir, 'memory.max'), String(l.memoryBytes));
        writeFileSync(path.join(dir, 'pids.max'), String(l.pids));
        writeFileSync(path.join(dir, 'cpu.max'), `${Math.max(1000, Math.round(l.cpus * 100000))} 100000`);
      };
      setLimits(limits);
      const kill = () => {
        if (!tryWrite(path.join(dir, 'cgroup.kill'), '1')) killPids(pidsOf(dir));
      };
      return {
        procsFiles: [path.join(dir, 'cgroup.procs')],
        setLimits,
        stats() {
          const oom = readKeyed(path.join(dir, 'memory.events'), 'oom_kill') ?? 0;
          const peak = readInt(path.join(dir, 'memory.peak'));
          const usec = readKeyed(path.join(dir, 'cpu.stat'), 'usage_usec');
          return {
            oomKilled: oom > 0,
            ...(peak !== undefined ? { maxRssMb: peak / (1024 * 1024) } : {}),
            ...(usec !== undefined ? { cpuTimeMs: Math.round(usec / 1000) } : {}),
          };
        },
        pids: () => pidsOf(dir),
        killAll: kill,
        stopAll: () => killPids(pidsOf(dir), 'SIGSTOP'),
        remove: async () => {
          kill();
          await rmdirRetry([dir]);
        },
      };
    },
    async removeOrphans() {
      const runs = readdirSync(parent, { withFileTypes: true }).filter((e) => e.isDirectory());
      await Promise.all(
        runs.map((r) => {
          tryWrite(path.join(parent, r.name, 'cgroup.kill'), '1');
          return rmdirRetry([path.join(parent, r.name)]);
        }),
      );
      return runs.length;
    },
    release: () => removeIfEmpty([parent]),
  };
}
