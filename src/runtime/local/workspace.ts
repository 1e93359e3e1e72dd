/**
 * The local runtime's place on the host: `<workspace>/sandbox/<instance>/`, the claim that keeps two
 * live processes off one workspace, and the `runs/` directory every run directory lives in (a tmpfs
 * when running as root, so what runs write is memory charged to their own cgroup, never host disk).
 *
 * `<instance>` is derived from the workspace path so two services on one machine never touch each
 * other's runs.
 */
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Config } from '../../config.ts';
import { execOk } from './runs/proc.ts';

const OWNER_FILE = 'owner.pid';

/** Directory of one instance (workspace) of the local runtime. */
export function instanceRoot(config: Pick<Config, 'workspace'>): { root: string; instance: string } {
  const ws = path.resolve(config.workspace);
  const instance = createHash('sha256').update(ws).digest('hex').slice(0, 12);
  return { root: path.join(ws, 'sandbox', instance), instance };
}

/**
 * Marks the workspace as this process's (`owner.pid`, created exclusively). A live other process
 * holding it is an error; a dead one's claim is taken over. Several runtimes of one process (tests)
 * may share it.
 */
export function claimWorkspace(root: string, workspace: string): void {
  mkdirSync(root, { recursive: true, mode: 0o755 });
  const file = path.join(root, OWNER_FILE);
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      writeFileSync(file, String(process.pid), { flag: 'wx' });
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const pid = Number(readFileSync(file, 'utf8').trim());
    if (pid === process.pid) return;
    if (Number.isInteger(pid) && pid > 0 && pidAlive(pid)) {
      throw new Error(`workspace ${workspace} is in use by another sandpod process (pid ${pid}); give each process its own SVC_WORKSPACE`);
    }
    rmSync(file, { force: true });
  }
  throw new Error(`could not claim workspace ${workspace}`);
}

/** Gives the workspace up if this process holds it. */
export function releaseWorkspace(root: string): void {
  const file = path.join(root, OWNER_FILE);
  try {
    if (Number(readFileSync(file, 'utf8').trim()) === process.pid) rmSync(file, { force: true });
  } catch {
    /* not claimed */
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Makes sure the sandbox user (uid 1000, which bwrap runs as) can reach `dir`: every ancestor needs
 * o+x. Inside the workspace the x bit (search, not listing) is added; above it this throws with what
 * is wrong rather than changing the host's directories.
 */
export function checkTraversable(dir: string, workspace: string): void {
  const ws = path.resolve(workspace);
  let d = path.resolve(dir);
  const parts: string[] = [];
  while (true) {
    parts.push(d);
    const up = path.dirname(d);
    if (up === d) break;
    d = up;
  }
  for (const p of parts.reverse()) {
    if (!existsSync(p)) mkdirSync(p, { mode: 0o755 });
    const mode = statSync(p).mode;
    if (process.getuid?.() !== 0 || (mode & 0o001) !== 0) continue;
    if (p === ws || p.startsWith(ws + path.sep)) chmodSync(p, (mode & 0o7777) | 0o001);
    else throw new Error(`path ${p} above the workspace is not traversable by the sandbox user (uid 1000); chmod o+x it or choose another workspace`);
  }
}

/**
 * Empties `runsDir` (run directories of an earlier process are orphans) and, when `tmpfs` is asked
 * (root with cgroups to charge it to), mounts a tmpfs on it. Resolves true when it is a tmpfs
 * (mounted now or by an earlier process of this workspace).
 */
export async function prepareRunsDir(runsDir: string, tmpfs: boolean): Promise<boolean> {
  const mounted = isMountPoint(runsDir);
  if (existsSync(runsDir)) {
    for (const e of readdirSync(runsDir)) rmSync(path.join(runsDir, e), { recursive: true, force: true });
  }
  mkdirSync(runsDir, { recursive: true, mode: 0o755 });
  if (mounted) return true;
  return tmpfs && (await execOk('mount', ['-t', 'tmpfs', '-o', 'mode=755,nosuid,nodev', 'sandpod-runs', runsDir]));
}

/** Undoes {@link prepareRunsDir}'s mount (lazily: runs still being cleaned up keep it until done). */
export async function releaseRunsDir(runsDir: string, tmpfs: boolean): Promise<void> {
  if (tmpfs) await execOk('umount', ['-l', runsDir]);
}

function isMountPoint(dir: string): boolean {
  try {
    return readFileSync('/proc/self/mounts', 'utf8').split('\n').some((l) => l.split(' ')[1] === dir);
  } catch {
    return false;
  }
}
