/**
 * A workspace a test can fill: a small tmpfs. As root with cgroups, the local runtime keeps each run
 * on a tmpfs of its own (charged to the run's memory), so a full workspace would not touch the runs;
 * {@link runsOnWorkspace} bind-mounts a directory of the workspace over the runs directory, so the runs
 * are on the full filesystem too, as on a host without cgroups.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { testDbKind } from './db.ts';

/** Why a small workspace cannot be had here (null when it can): it needs root, and PostgreSQL, since PGlite lives in the workspace. */
export async function smallWorkspaceUnavailable(): Promise<string | null> {
  if (process.getuid?.() !== 0) return 'mounting a tmpfs needs root';
  if ((await testDbKind()) !== 'postgres') return 'needs PostgreSQL (PGlite lives in the workspace)';
  return null;
}

/** Mounts a tmpfs of `sizeMb` at a new directory named after `name`; returns the directory. */
export function mountSmallWorkspace(name: string, sizeMb = 48): string {
  const ws = mkdtempSync(path.join(tmpdir(), `sandpod-${name}-`));
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeMb}m,mode=755`, `sandpod-${name}-ws`, ws]);
  return ws;
}

/** Puts the runs directory of the service started on `ws` onto `ws` itself; returns it (for {@link unmountSmallWorkspace}). */
export function runsOnWorkspace(ws: string): string {
  const sandboxDir = path.join(ws, 'sandbox');
  const runsDir = path.join(sandboxDir, readdirSync(sandboxDir).find((d) => readdirSync(path.join(sandboxDir, d)).includes('runs'))!, 'runs');
  const onWs = path.join(ws, 'runs-on-workspace');
  mkdirSync(onWs, { mode: 0o755 });
  execFileSync('mount', ['--bind', onWs, runsDir]);
  return runsDir;
}

/** Undoes {@link runsOnWorkspace} and {@link mountSmallWorkspace} (either may not have happened) and removes the directory. */
export function unmountSmallWorkspace(ws: string | undefined, runsDir: string | undefined): void {
  if (runsDir) spawnSync('umount', ['-l', runsDir]);
  if (ws) {
    spawnSync('umount', ['-l', ws]);
    rmSync(ws, { recursive: true, force: true });
  }
}
