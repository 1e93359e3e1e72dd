/**
 * Issue #9 point 4: nothing user code can reach is outside the sandbox's rules. From inside a real
 * sandbox (gVisor and bubblewrap; nothing mocked) the program tries to get into every other process
 * it can see — PID 1, the runner, the in-process path's waiting shell, the egress relay's runner — by
 * opening `/proc/<pid>/mem` for reading and for writing, `ptrace(PTRACE_ATTACH)`, and
 * `process_vm_readv`/`process_vm_writev`. Every attempt must fail with a permission error, with the
 * syscall filter on and off (the guarantee must not rest on the filter alone: `enable_seccomp` can
 * be switched off, and opening `/proc/<pid>/mem` is not a syscall a filter can tell apart).
 *
 * A control keeps the probe honest: the same attempts against a child the program forked itself
 * must get through wherever the engine supports them.
 */
import { mkdtempSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry, type JobType } from '../../../src/jobtypes/job-type.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import type { EngineName } from '../../../src/runtime/local/engines.ts';
import type { RunSpec } from '../../../src/runtime/runtime.ts';
import { describeEachEngineAndMode, modeConfig, runAs, type RunMode } from '../../support/engines.ts';

const EPERM = 1;
const EACCES = 13;
const EFAULT = 14;
/** gVisor (20221219) does not implement process_vm_readv/writev: they fail with ENOSYS for every target. */
const ENOSYS = 38;

/** The program: probes every other process it sees, and a child of its own as the control. */
const PROBE = String.raw`
import ctypes, json, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
NR = {'x86_64': (310, 311), 'aarch64': (270, 271)}[platform.machine()]

class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]

buf = ctypes.create_string_buffer(8)

def probe(pid):
    r = {}
    for name, flags in (('open_mem_read', os.O_RDONLY), ('open_mem_write', os.O_WRONLY)):
        try:
            os.close(os.open('/proc/%d/mem' % pid, flags))
            r[name] = 'ok'
        except OSError as e:
            r[name] = e.errno
    rc = libc.ptrace(PTRACE_ATTACH, pid, None, None)
    r['ptrace_attach'] = 'ok' if rc == 0 else ctypes.get_errno()
    if rc == 0:
        try:
            os.waitpid(pid, 0x40000000)  # __WALL
        except OSError:
            pass
        libc.ptrace(PTRACE_DETACH, pid, None, None)
    local = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
    # An address that is surely unmapped: EFAULT means the permission check was passed.
    remote = iovec(ctypes.c_void_p(4096), 8)
    for name, nr in zip(('process_vm_readv', 'process_vm_writev'), NR):
        rc = libc.syscall(nr, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        r[name] = 'ok' if rc >= 0 else ctypes.get_errno()
    return r

me = os.getpid()
seen = {}
for n in os.listdir('/proc'):
    if n.isdigit() and int(n) != me:
        try:
            cmd = open('/proc/%s/cmdline' % n, 'rb').read().replace(b'\0', b' ').decode('utf-8', 'replace').strip()
        except OSError:
            cmd = '?'
        seen[n] = {'cmd': cmd, 'result': probe(int(n))}
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
control = probe(child)
os.kill(child, 9)
os.waitpid(child, 0)
print(json.dumps({'me': me, 'ppid': os.getppid(), 'seen': seen, 'control': control}))
`;

interface ProbeOut {
  me: number;
  ppid: number;
  seen: Record<string, { cmd: string; result: Record<string, string | number> }>;
  control: Record<string, string | number>;
}

function makeConfig(engine: EngineName, extra: Record<string, unknown> = {}): Config {
  const workspace = mkdtempSync(path.join('/tmp/sandpod-test', `r-${engine.slice(0, 2)}-`));
  return parseConfig({ workspace, sandbox_engine: engine, ...extra }, {});
}

function spec(config: Config, jt: Partial<JobType> = {}): RunSpec {
  return {
    executionId: `t-${Math.random().toString(36).slice(2)}`,
    code: PROBE,
    inputJson: '{}',
    jobType: { ...new FileJobTypeRegistry(config).get('default')!, ...jt },
    timeoutSec: 30,
    startupTimeoutSec: 60,
    requirements: [],
    maxStdoutBytes: 65536,
    maxArtifactBytes: 1024 * 1024,
  };
}

async function probe(mode: RunMode, rt: LocalRuntime, config: Config, jt: Partial<JobType> = {}): Promise<ProbeOut> {
  const r = await runAs(mode, rt, spec(config, jt));
  expect(r.stderr).toBe('');
  expect(r.observation.exitCode).toBe(0);
  return JSON.parse(r.stdout) as ProbeOut;
}

/**
 * Every process but the program itself is out of reach: each attempt failed with a permission error
 * (or, for process_vm_* on gVisor, because the call does not exist there).
 */
function expectOutOfReach(out: ProbeOut, engine: EngineName): void {
  // The program sees PID 1 and its parent at least (whatever they are on this engine and path).
  expect(Object.keys(out.seen)).toContain('1');
  expect(Object.keys(out.seen)).toContain(String(out.ppid));
  for (const [pid, { cmd, result }] of Object.entries(out.seen)) {
    for (const [attempt, got] of Object.entries(result)) {
      const refused = engine === 'gvisor' && attempt.startsWith('process_vm_') ? [EPERM, ENOSYS] : [EPERM, EACCES];
      expect({ pid, cmd, attempt, got }).toEqual({ pid, cmd, attempt, got: expect.toBeOneOf(refused) });
    }
  }
}

/** The probe can get into a process it may legitimately reach (its own child). */
function expectControlReachable(out: ProbeOut, engine: EngineName, seccomp: boolean): void {
  expect(out.control.open_mem_read).toBe('ok');
  // gVisor's /proc/<pid>/mem is read-only.
  expect(out.control.open_mem_write).toBe(engine === 'gvisor' ? EACCES : 'ok');
  if (!seccomp) {
    expect(out.control.ptrace_attach).toBe('ok');
    // Past the permission check: the unmapped address answers EFAULT.
    if (engine === 'bubblewrap') expect(out.control.process_vm_writev).toBe(EFAULT);
  }
}

describeEachEngineAndMode('what the program can reach on %s', (engine, mode) => {
  for (const seccomp of [true, false]) {
    describe(seccomp ? 'with the syscall filter' : 'without the syscall filter', () => {
      let config: Config;
      let rt: LocalRuntime;
      beforeAll(async () => {
        config = makeConfig(engine, { ...modeConfig(mode), enable_seccomp: seccomp });
        rt = createLocalRuntime(config);
        await rt.start();
      });
      afterAll(async () => {
        await rt?.stop();
      });

      it('cannot open, attach to, read or write PID 1 or any other process of the sandbox', async () => {
        // Cold, as root with cgroups, this takes a warm process: on bubblewrap the in-process path (a
        // waiting shell, the program in the runner's process); otherwise the forking runner. A warm
        // sandbox: the forking runner that waited for its go line (`--wait`) is the program's parent.
        const out = await probe(mode, rt, config);
        expectOutOfReach(out, engine);
        // (The in-process path really ran: the program's parent is the waiting shell of `--exec`.)
        if (mode === 'cold' && engine === 'bubblewrap' && process.getuid?.() === 0) expect(out.seen[String(out.ppid)]!.cmd).toMatch(/^\/runner\/sh -c .* --exec /);
        if (mode !== 'cold') expect(out.seen[String(out.ppid)]!.cmd).toContain(' --wait');
        expectControlReachable(out, engine, seccomp);
      });

      it('nor the runner that relays the egress proxy (allowed_hosts: the forking runner with relay threads; warm sandboxes too)', async () => {
        const out = await probe(mode, rt, config, { network: { mode: 'bridge', allowedHosts: ['example.org'] } });
        expectOutOfReach(out, engine);
        expect(out.seen[String(out.ppid)]!.cmd).toContain('--egress-proxy');
        expectControlReachable(out, engine, seccomp);
      });
    });
  }
});
