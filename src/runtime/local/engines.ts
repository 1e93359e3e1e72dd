/**
 * Which sandbox engines this machine has, and which one a configuration gets.
 *
 * Strength order: gVisor (`runsc`, a user-space kernel) > bubblewrap (`bwrap`, namespaces) > process
 * (no isolation; `permissive` only).
 */
import { accessSync, constants, statSync } from 'node:fs';
import path from 'node:path';
import type { Config } from '../../config.ts';

/** A local sandbox engine. */
export type EngineName = 'gvisor' | 'bubblewrap' | 'process';

/** Engines from strongest to weakest. */
export const ENGINE_ORDER: readonly EngineName[] = ['gvisor', 'bubblewrap', 'process'];

/** Binaries found on this machine (null when absent). */
export interface EngineBinaries {
  runsc: string | null;
  bwrap: string | null;
  setpriv: string | null;
  sh: string;
}

/** Finds an executable by name (or checks an absolute path), like `command -v`. */
export function which(name: string, envPath = process.env.PATH ?? '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'): string | null {
  const candidates = name.includes('/') ? [name] : [...envPath.split(':'), '/usr/sbin', '/usr/bin', '/sbin', '/bin'].map((d) => path.join(d, name));
  for (const c of candidates) {
    try {
      accessSync(c, constants.X_OK);
      if (statSync(c).isFile()) return c;
    } catch {
      /* next */
    }
  }
  return null;
}

/**
 * Looks up the engines' binaries. `container_runtime` names the gVisor binary (default `runsc`).
 * Presence only; {@link createLocalRuntime}'s `start()` proves an engine works by running a sandbox.
 */
export function findEngineBinaries(config: Pick<Config, 'container_runtime'>): EngineBinaries {
  return {
    runsc: which(config.container_runtime || 'runsc') ?? which('runsc'),
    bwrap: which('bwrap'),
    setpriv: which('setpriv'),
    sh: which('sh') ?? '/bin/sh',
  };
}

/**
 * The engines to try for a configuration, in order. `strict` allows only gVisor; `process` is never
 * offered in `strict`; `auto` lists everything allowed, strongest first.
 */
export function candidateEngines(config: Pick<Config, 'sandbox_engine' | 'security_mode'>): EngineName[] {
  const allowed = ENGINE_ORDER.filter((e) => config.security_mode !== 'strict' || e === 'gvisor');
  if (config.sandbox_engine === 'auto') return [...allowed];
  return allowed.includes(config.sandbox_engine) ? [config.sandbox_engine] : [];
}

/** Whether the engine's binaries are present (a cheap check; no sandbox is started). */
export function engineInstalled(engine: EngineName, bins: EngineBinaries): boolean {
  if (engine === 'gvisor') return bins.runsc !== null;
  if (engine === 'bubblewrap') return bins.bwrap !== null;
  return true;
}
