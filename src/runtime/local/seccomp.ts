/**
 * The syscall filter of a run (SPEC §1.7 "syscall filtering", switchable with `enable_seccomp`).
 *
 * A deny-list on top of what the sandbox already forbids: kernel-facing syscalls that an
 * unprivileged program has no business calling (mount, ptrace, bpf, keyring, module loading, new
 * namespaces, io_uring …). Denied calls fail with EPERM rather than killing the process, so programs
 * that probe for features keep running. `clone3` gets ENOSYS so libc falls back to `clone`, whose
 * flags the filter can inspect.
 *
 * `ptrace` and `process_vm_readv`/`process_vm_writev` are on the list, but the filter is not what
 * keeps the program out of the sandbox's other processes (issue #9): it can be switched off, and
 * opening `/proc/<pid>/mem` is an ordinary `open` it cannot tell apart. That rests on no process
 * beside the program being dumpable (runner.py, SandboxHost.waitingShell) and on bubblewrap keeping
 * no init of its own in the sandbox (`--as-pid-1`, sandbox.ts).
 */

/** Syscalls denied with EPERM, by name (names as in the OCI/libseccomp tables). */
export const DENIED_SYSCALLS = [
  'acct', 'add_key', 'adjtimex', 'bpf', 'chroot', 'clock_settime', 'create_module', 'delete_module',
  'fanotify_init', 'finit_module', 'fsconfig', 'fsmount', 'fsopen', 'fspick', 'get_kernel_syms',
  'init_module', 'io_uring_enter', 'io_uring_register', 'io_uring_setup', 'ioperm', 'iopl', 'kcmp',
  'kexec_file_load', 'kexec_load', 'keyctl', 'lookup_dcookie', 'mbind', 'migrate_pages', 'mount',
  'mount_setattr', 'move_mount', 'move_pages', 'name_to_handle_at', 'nfsservctl', 'open_by_handle_at',
  'open_tree', 'perf_event_open', 'pivot_root', 'process_vm_readv', 'process_vm_writev', 'ptrace',
  'query_module', 'quotactl', 'reboot', 'request_key', 'set_mempolicy', 'setdomainname', 'sethostname',
  'setns', 'settimeofday', 'swapoff', 'swapon', 'syslog', 'umount2', 'unshare', 'uselib', 'userfaultfd',
  'vhangup',
] as const;

const X86_64: Record<string, number> = {
  acct: 163, add_key: 248, adjtimex: 159, bpf: 321, chroot: 161, clock_settime: 227, create_module: 174,
  delete_module: 176, fanotify_init: 300, finit_module: 313, fsconfig: 431, fsmount: 432, fsopen: 430,
  fspick: 433, get_kernel_syms: 177, init_module: 175, io_uring_enter: 426, io_uring_register: 427,
  io_uring_setup: 425, ioperm: 173, iopl: 172, kcmp: 312, kexec_file_load: 320, kexec_load: 246, keyctl: 250,
  lookup_dcookie: 212, mbind: 237, migrate_pages: 256, mount: 165, mount_setattr: 442, move_mount: 429,
  move_pages: 279, name_to_handle_at: 303, nfsservctl: 180, open_by_handle_at: 304, open_tree: 428,
  perf_event_open: 298, pivot_root: 155, process_vm_readv: 310, process_vm_writev: 311, ptrace: 101,
  query_module: 178, quotactl: 179, reboot: 169, request_key: 249, set_mempolicy: 238, setdomainname: 171,
  sethostname: 170, setns: 308, settimeofday: 164, swapoff: 168, swapon: 167, syslog: 103, umount2: 166,
  unshare: 272, uselib: 134, userfaultfd: 323, vhangup: 153,
  clone: 56, clone3: 435,
};

// aarch64 uses the generic table; syscalls that do not exist there are simply absent.
const AARCH64: Record<string, number> = {
  acct: 89, add_key: 217, adjtimex: 171, bpf: 280, chroot: 51, clock_settime: 112, delete_module: 106,
  fanotify_init: 262, finit_module: 273, fsconfig: 431, fsmount: 432, fsopen: 430, fspick: 433, init_module: 105,
  io_uring_enter: 426, io_uring_register: 427, io_uring_setup: 425, kcmp: 272, kexec_file_load: 294,
  kexec_load: 104, keyctl: 219, lookup_dcookie: 18, mbind: 235, migrate_pages: 238, mount: 40,
  mount_setattr: 442, move_mount: 429, move_pages: 239, name_to_handle_at: 264, nfsservctl: 42,
  open_by_handle_at: 265, open_tree: 428, perf_event_open: 241, pivot_root: 41, process_vm_readv: 270,
  process_vm_writev: 271, ptrace: 117, quotactl: 60, reboot: 142, request_key: 218, set_mempolicy: 237,
  setdomainname: 162, sethostname: 161, setns: 268, settimeofday: 170, swapoff: 225, swapon: 224, syslog: 116,
  umount2: 39, unshare: 97, userfaultfd: 282, vhangup: 58,
  clone: 220, clone3: 435,
};

const AUDIT_ARCH: Record<string, number> = { x64: 0xc000003e, arm64: 0xc00000b7 };
/** CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET */
const CLONE_FLAG_BITS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000];
const CLONE_NS_FLAGS = CLONE_FLAG_BITS.reduce((a, b) => a | b, 0);
const EPERM = 1;
const ENOSYS = 38;
const RET_ALLOW = 0x7fff0000;
const RET_KILL_PROCESS = 0x80000000;
const RET_ERRNO = 0x00050000;

type Insn = { code: number; jt?: number | string; jf?: number | string; k: number; label?: string };

/**
 * Compiles the deny-list to a classic BPF program (`struct sock_filter[]`, little endian) as bwrap's
 * `--seccomp FD` expects. Throws on an architecture without a table.
 */
export function compileSeccompBpf(arch: string = process.arch): Buffer {
  const table = arch === 'x64' ? X86_64 : arch === 'arm64' ? AARCH64 : null;
  const audit = AUDIT_ARCH[arch];
  if (!table || audit === undefined) throw new Error(`no seccomp syscall table for architecture ${arch}`);
  const LD_W_ABS = 0x20, JEQ = 0x15, JGE = 0x35, JSET = 0x45, RET = 0x06;
  const prog: Insn[] = [
    { code: LD_W_ABS, k: 4 },
    { code: JEQ, jt: 1, jf: 0, k: audit },
    { code: RET, k: RET_KILL_PROCESS },
    { code: LD_W_ABS, k: 0 },
  ];
  // x32 syscalls on x86_64 share the arch value but set bit 30: refuse them all.
  if (arch === 'x64') prog.push({ code: JGE, jt: 'deny', jf: 0, k: 0x40000000 });
  prog.push({ code: JEQ, jt: 'clone', jf: 0, k: table.clone! });
  prog.push({ code: JEQ, jt: 'enosys', jf: 0, k: table.clone3! });
  for (const name of DENIED_SYSCALLS) {
    const nr = table[name];
    if (nr !== undefined) prog.push({ code: JEQ, jt: 'deny', jf: 0, k: nr });
  }
  prog.push({ code: RET, k: RET_ALLOW });
  prog.push({ label: 'clone', code: LD_W_ABS, k: 16 }); // args[0], low 32 bits (little endian)
  prog.push({ code: JSET, jt: 'deny', jf: 0, k: CLONE_NS_FLAGS });
  prog.push({ code: RET, k: RET_ALLOW });
  prog.push({ label: 'enosys', code: RET, k: RET_ERRNO | ENOSYS });
  prog.push({ label: 'deny', code: RET, k: RET_ERRNO | EPERM });

  const labels = new Map<string, number>();
  prog.forEach((insn, i) => insn.label && labels.set(insn.label, i));
  const rel = (i: number, target: number | string | undefined): number => {
    if (target === undefined) return 0;
    if (typeof target === 'number') return target;
    const off = labels.get(target)! - i - 1;
    if (off < 0 || off > 255) throw new Error('seccomp program too long');
    return off;
  };
  const buf = Buffer.alloc(prog.length * 8);
  prog.forEach((insn, i) => {
    buf.writeUInt16LE(insn.code, i * 8);
    buf.writeUInt8(rel(i, insn.jt), i * 8 + 2);
    buf.writeUInt8(rel(i, insn.jf), i * 8 + 3);
    buf.writeUInt32LE(insn.k >>> 0, i * 8 + 4);
  });
  return buf;
}

/**
 * The same policy as an OCI `linux.seccomp` section (applied by runsc with `--oci-seccomp`), but for
 * `clone3`: runsc ignores `errnoRet` (20221219 answers EPERM to every SCMP_ACT_ERRNO), and an EPERM
 * from clone3 makes glibc's pthread_create fail instead of falling back to `clone`: no thread could
 * start. gVisor answers clone3 ENOSYS itself where it does not implement it, and namespaces made in
 * gVisor are the sentry's own.
 */
export function ociSeccomp(arch: string = process.arch): Record<string, unknown> {
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: [arch === 'arm64' ? 'SCMP_ARCH_AARCH64' : 'SCMP_ARCH_X86_64'],
    syscalls: [
      { names: [...DENIED_SYSCALLS], action: 'SCMP_ACT_ERRNO', errnoRet: EPERM },
      // OCI rules cannot say "masked != 0", so one rule per namespace flag (rules are OR-ed).
      ...CLONE_FLAG_BITS.map((bit) => ({
        names: ['clone'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 0, value: bit, valueTwo: bit, op: 'SCMP_CMP_MASKED_EQ' }],
      })),
    ],
  };
}
