/**
 * Run as its own process by test/unit/util/inherited-fds.test.ts, with fds the test leaves open
 * without close-on-exec: prints what this process found inherited and what a sandbox-style child
 * started by `spawnProc` (with one fd file, as the seccomp filter is passed) holds.
 */
import { spawnProc } from '../../src/runtime/local/runs/proc.ts';
import { scanInheritedFds } from '../../src/util/inherited-fds.ts';

const p = spawnProc('/bin/sh', ['-c', 'ls -l /proc/$$/fd'], { PATH: '/usr/bin:/bin' }, ['/etc/hostname'], undefined, false);
let listing = '';
p.child.stdout!.on('data', (d: Buffer) => (listing += d.toString()));
const [code] = await p.closed;
process.stdout.write(JSON.stringify({ inherited: scanInheritedFds(), code, listing }));
