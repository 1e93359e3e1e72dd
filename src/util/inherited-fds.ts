/**
 * File descriptors this process inherited without close-on-exec.
 *
 * Node opens every descriptor of its own with O_CLOEXEC, and libuv's spawn leaves any fd ≥ 3 that is
 * not close-on-exec open in the child. So an fd handed down by whoever started the service (a CI
 * harness's pipe, a shell's redirect) reaches every child, and through bubblewrap every sandbox.
 * Closing them here would be wrong (they are not ours, and a harness may watch them), so children
 * get /dev/null over each of them instead ({@link coverInheritedFds}).
 */
import { readdirSync, readFileSync } from 'node:fs';

const O_CLOEXEC = 0o2000000;
let cached: number[] | null = null;

/**
 * Reads /proc/self/fdinfo: the fds ≥ 3 without close-on-exec (Node's IPC channel to a parent
 * included: a sandbox has no business with that either).
 */
export function scanInheritedFds(): number[] {
  let names: string[];
  try {
    names = readdirSync('/proc/self/fd');
  } catch {
    return [];
  }
  const out: number[] = [];
  for (const name of names) {
    const fd = Number(name);
    if (!Number.isInteger(fd) || fd < 3) continue;
    try {
      const m = /^flags:\s*([0-7]+)/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'));
      if (m && (parseInt(m[1]!, 8) & O_CLOEXEC) === 0) out.push(fd);
    } catch {
      /* closed meanwhile (the directory's own fd) */
    }
  }
  return out.sort((a, b) => a - b);
}

/** {@link scanInheritedFds}, once per process: Node never creates such fds later. */
export function inheritedFds(): readonly number[] {
  cached ??= scanInheritedFds();
  return cached;
}

/**
 * Extends a `stdio` array for `child_process.spawn` so every inherited fd the array does not already
 * set becomes `devNull` in the child (libuv dup2s it over the inherited one). Gaps stay 'ignore',
 * which leaves close-on-exec fds to close at exec.
 */
export function coverInheritedFds<T>(stdio: (T | 'ignore' | number)[], devNull: number, fds: readonly number[] = inheritedFds()): (T | 'ignore' | number)[] {
  const out = [...stdio];
  for (const fd of fds) {
    if (fd < out.length) continue;
    while (out.length < fd) out.push('ignore');
    out.push(devNull);
  }
  return out;
}
