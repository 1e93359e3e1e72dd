/**
 * Turns an engine-neutral description of one sandbox ({@link SandboxSpec}) into the command that
 * starts it: `bwrap …`, `runsc … run` with an OCI bundle, or a plain process. Every engine gets the
 * same picture: read-only root made of the host's `/usr` and a generated `/etc`, the run's mounts,
 * uid/gid 1000, no capabilities, no_new_privs, no network unless asked, the seccomp filter when
 * enabled, a clean environment, and (when cgroups are usable) the run's cgroups entered by a
 * one-line `sh` wrapper before anything else is executed.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, chownSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, realpathSync, statSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { EngineBinaries, EngineName } from './engines.ts';
import { ociSeccomp } from './seccomp.ts';

/** uid and gid of user code (SPEC §1.7). */
export const SANDBOX_UID = 1000;
export const SANDBOX_GID = 1000;
/** Exit status of the cgroup wrapper when the run's cgroup could not be entered. */
export const WRAPPER_FAILED_EXIT = 199;

/** A mount inside the sandbox. */
export type Mount =
  | { type: 'ro' | 'rw'; src: string; dest: string }
  | { type: 'tmpfs'; dest: string; sizeBytes: number };

/** One sandbox to start. */
export interface SandboxSpec {
  /** Unique id (runsc container id); `[A-Za-z0-9_.-]+`. */
  id: string;
  /** Host directory of this sandbox (the OCI bundle goes there). */
  dir: string;
  /** Command inside the sandbox (paths as the sandbox sees them; see {@link SandboxHost.insidePath}). */
  argv: string[];
  /** The whole environment of the command. */
  env: Record<string, string>;
  cwd: string;
  mounts: Mount[];
  network: boolean;
  /**
   * The sandbox connects to host Unix sockets bound into it (the egress proxy of an `allowed_hosts`
   * job type). gVisor refuses that unless told (`--host-uds=open`); bubblewrap needs nothing.
   */
  hostSockets?: boolean;
  rlimits: { fsize?: number; nofile: number; nproc?: number };
  /** cgroup.procs files to enter before exec (empty without cgroups). */
  procsFiles: string[];
  /**
   * gVisor: start the sandbox by restoring this checkpoint image (`runsc restore`) instead of
   * booting it (pool/restore-images.ts). The spec must be that of the checkpointed sandbox but for
   * the host directories its mounts come from.
   */
  restoreImage?: string;
}

/** What a launch needs from the host, prepared once at start. */
export interface SandboxHostOptions {
  engine: EngineName;
  bins: EngineBinaries;
  /** `<workspace>/sandbox/<instance>`: rootfs, etc, runner, runsc state live below. */
  root: string;
  runnerSource: string;
  seccomp: boolean;
  gvisorPlatform: string;
  /** Host paths bound read-only at the same path (interpreter prefixes outside /usr, find-links dirs). */
  extraRo: string[];
}

/** A command ready to spawn. */
export interface Launch {
  file: string;
  args: string[];
  env: Record<string, string>;
  /** Files to open read-only as the child's fds 3, 4, … (the seccomp program for bwrap). */
  fdFiles: string[];
  /** The runsc container id, when the engine is gVisor. */
  runscId?: string;
  /** Host working directory (the `process` engine only). */
  cwd?: string;
}

const HOST_PATH = '/usr/sbin:/usr/bin:/sbin:/bin';
/** Where a run's egress proxy socket directory is mounted. */
export const EGRESS_DIR = '/run/sandpod';
const ROOT_SYMLINKS: [string, string][] = [
  ['usr/bin', '/bin'],
  ['usr/sbin', '/sbin'],
  ['usr/lib', '/lib'],
  ['usr/lib64', '/lib64'],
  ['usr/lib32', '/lib32'],
  ['usr/libx32', '/libx32'],
];
/**
 * Host bits of /etc that programs legitimately need, bound read-only: TLS roots, name resolution for
 * bridge jobs, and the dynamic linker's view of /usr: Debian's alternatives links (python3-numpy
 * finds libblas.so.3 through /etc/alternatives) and ld.so.cache (libraries outside the default
 * paths). Nothing else of the host's /etc.
 */
const HOST_ETC = ['/etc/ssl', '/etc/ca-certificates', '/etc/resolv.conf', '/etc/host.conf', '/etc/gai.conf', '/etc/mime.types', '/etc/alternatives', '/etc/ld.so.cache'];
/** The execute-only copy of `sh` in the runner directory (see {@link SandboxHost.waitingShell}). */
const WAITING_SHELL = 'sh';
/** Mount points every run uses; created in the gVisor rootfs. */
const MOUNT_POINTS = ['/code', '/input', '/output', '/tmp', '/deps', '/runner', '/proc', '/dev', '/usr', '/deps-build', EGRESS_DIR];

/** Prepared host state for one engine: rootfs/etc/runner copies, seccomp program, command builder. */
export class SandboxHost {
  readonly engine: EngineName;
  readonly runnerDir: string;
  readonly runscState: string;
  private readonly etcDir: string;
  private readonly rootfs: string;
  private readonly seccompFile: string | null;
  private readonly dropPrivileges: boolean;
  private readonly hostEtc: string[];
  private readonly symlinks: [string, string][];
  private readonly compiled = new Map<string, string>();
  private readonly shell: string;

  constructor(private readonly o: SandboxHostOptions, seccompBpf: Buffer | null) {
    this.engine = o.engine;
    this.runnerDir = path.join(o.root, 'runner');
    this.etcDir = path.join(o.root, 'rootfs', 'etc');
    this.rootfs = path.join(o.root, 'rootfs');
    this.runscState = path.join(o.root, 'runsc');
    this.dropPrivileges = process.getuid?.() === 0;
    this.seccompFile = seccompBpf && o.seccomp && o.engine === 'bubblewrap' ? path.join(o.root, 'seccomp.bpf') : null;
    this.hostEtc = HOST_ETC.filter((p) => existsSync(p));
    this.symlinks = ROOT_SYMLINKS.filter(([target]) => existsSync(path.join('/', target)));
    for (const d of [o.root, this.runnerDir, this.rootfs, this.etcDir, this.runscState]) mkdirSync(d, { recursive: true, mode: 0o755 });
    writeFileSync(path.join(this.runnerDir, 'runner.py'), readFileSync(o.runnerSource), { mode: 0o644 });
    this.shell = this.prepareWaitingShell();
    writeFileSync(path.join(this.etcDir, 'passwd'), `root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:${SANDBOX_UID}:${SANDBOX_GID}:sandbox:/tmp:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n`);
    writeFileSync(path.join(this.etcDir, 'group'), `root:x:0:\nsandbox:x:${SANDBOX_GID}:\nnogroup:x:65534:\n`);
    writeFileSync(path.join(this.etcDir, 'hosts'), '127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n');
    writeFileSync(path.join(this.etcDir, 'hostname'), 'sandbox\n');
    writeFileSync(path.join(this.etcDir, 'nsswitch.conf'), 'passwd: files\ngroup: files\nhosts: files dns\n');
    for (const p of this.hostEtc) {
      const target = path.join(this.rootfs, p);
      if (existsSync(target)) continue;
      if (readIsDir(p)) mkdirSync(target, { recursive: true });
      else closeSync(openSync(target, 'a'));
    }
    if (this.seccompFile && seccompBpf) writeFileSync(this.seccompFile, seccompBpf);
    // gVisor needs every mount point to exist in its read-only root.
    for (const p of [...MOUNT_POINTS, ...o.extraRo]) mkdirSync(path.join(this.rootfs, p), { recursive: true });
    for (const [target, link] of this.symlinks) {
      try {
        symlinkSync(target, path.join(this.rootfs, link));
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
    }
  }

  /**
   * The runner as the sandbox sees it, for an interpreter: a `.pyc` compiled by that interpreter at
   * start (a script is never cached, and compiling runner.py costs a few ms on every run), or the
   * `.py` when compiling failed.
   */
  runnerFor(interpreter: string): string {
    let name = this.compiled.get(interpreter);
    if (name === undefined) {
      name = 'runner.py';
      const pyc = `runner-${createHash('sha256').update(interpreter).digest('hex').slice(0, 12)}.pyc`;
      try {
        execFileSync(interpreter, ['-I', '-c', 'import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)', path.join(this.runnerDir, 'runner.py'), path.join(this.runnerDir, pyc)], { stdio: 'ignore', timeout: 30_000 });
        chmodSync(path.join(this.runnerDir, pyc), 0o644);
        name = pyc;
      } catch {
        /* run the source */
      }
      this.compiled.set(interpreter, name);
    }
    return `/runner/${name}`;
  }

  /**
   * The `sh` a sandbox command may use as a process that stays beside the program (the waiting
   * parent of an in-process run, runner-command.ts), as the sandbox sees it.
   *
   * On bubblewrap that shell is PID 1 of the sandbox (`--as-pid-1`) and the program's parent, with
   * the program's uid: were it dumpable, the program could open its `/proc/<pid>/mem`, attach to it
   * or use process_vm_writev on it (issue #9). `sh` cannot call prctl(PR_SET_DUMPABLE), but the
   * kernel makes a process non-dumpable when it execs a file it may not read (execve's "would dump"
   * rule, the one that protects execute-only binaries), so the sandbox gets an execute-only (0111)
   * copy of the host's `sh` at `/runner/sh`. Its children that exec something readable (the runner)
   * are dumpable again, as a plain program is. Other engines: the host's `sh`.
   */
  waitingShell(): string {
    return this.shell;
  }

  private prepareWaitingShell(): string {
    if (this.engine !== 'bubblewrap') return this.o.bins.sh;
    const copy = path.join(this.runnerDir, WAITING_SHELL);
    try {
      unlinkSync(copy);
    } catch {
      /* not there yet */
    }
    writeFileSync(copy, readFileSync(realpathSync(this.o.bins.sh)), { mode: 0o111 });
    chmodSync(copy, 0o111);
    return `/runner/${WAITING_SHELL}`;
  }

  /** Files a launch of this host opens as fds 3… (same for every sandbox; warm processes get them early). */
  fdFiles(): string[] {
    return this.seccompFile ? [this.seccompFile] : [];
  }

  /**
   * The ids a launch drops root to before the engine starts (`setpriv` in {@link launch}), or null
   * when it runs as it is (not root, or gVisor, whose runsc needs root and sets the ids itself).
   */
  privilegeDrop(): { uid: number; gid: number } | null {
    return this.dropPrivileges && this.engine !== 'gvisor' ? { uid: SANDBOX_UID, gid: SANDBOX_GID } : null;
  }

  /** Where a path mounted at `dest` is seen by the command (the host path for the `process` engine). */
  insidePath(spec: Pick<SandboxSpec, 'mounts'>, dest: string): string {
    if (this.engine !== 'process') return dest;
    for (const m of spec.mounts) {
      if (m.type === 'tmpfs') continue;
      if (dest === m.dest || dest.startsWith(m.dest + '/')) return m.src + dest.slice(m.dest.length);
    }
    if (dest === '/runner' || dest.startsWith('/runner/')) return this.runnerDir + dest.slice('/runner'.length);
    return dest;
  }

  /**
   * Builds the command for a sandbox; writes the OCI bundle for gVisor. `prepared`: the process
   * that will exec it already dropped privileges ({@link privilegeDrop}) and is in its cgroups.
   */
  launch(spec: SandboxSpec, prepared = false): Launch {
    const inner: { cmd: string[]; env: Record<string, string>; fdFiles: string[]; runscId?: string } = this.engine === 'gvisor' ? this.runsc(spec) : this.engine === 'bubblewrap' ? this.bwrap(spec) : this.processCmd(spec);
    const privDrop =
      this.privilegeDrop() && !prepared
        ? [this.o.bins.setpriv ?? 'setpriv', `--reuid=${SANDBOX_UID}`, `--regid=${SANDBOX_GID}`, '--clear-groups', '--inh-caps=-all', '--no-new-privs']
        : [];
    let cmd = [...privDrop, ...inner.cmd];
    if (spec.procsFiles.length > 0 && !prepared) {
      cmd = [this.o.bins.sh, '-c', `${enterCgroups(spec.procsFiles)}; exec "$@"`, 'sh', ...cmd];
    }
    return {
      file: cmd[0]!,
      args: cmd.slice(1),
      env: inner.env,
      fdFiles: inner.fdFiles,
      ...(inner.runscId ? { runscId: inner.runscId } : {}),
      ...(this.engine === 'process' ? { cwd: this.insidePath(spec, spec.cwd) } : {}),
    };
  }

  private bwrap(spec: SandboxSpec): { cmd: string[]; env: Record<string, string>; fdFiles: string[] } {
    const a: string[] = [this.o.bins.bwrap ?? 'bwrap'];
    a.push('--unshare-user', '--unshare-ipc', '--unshare-pid', '--unshare-uts', '--unshare-cgroup-try');
    // No bwrap init in the sandbox: without --as-pid-1 bwrap's own reaper is PID 1 there, with the
    // program's uid, dumpable and outside the syscall filter (bwrap applies --seccomp only to the
    // command), so the program could open /proc/1/mem, ptrace it or process_vm_writev into it
    // (issue #9). With it the command is PID 1: the runner, which makes itself non-dumpable
    // (runner.py), or the execute-only waiting shell (waitingShell). PID 1 exiting kills whatever
    // is left in the namespace, as bwrap's init did; bwrap's monitor outside passes its status on.
    a.push('--as-pid-1');
    if (!spec.network) a.push('--unshare-net');
    a.push('--disable-userns', '--uid', String(SANDBOX_UID), '--gid', String(SANDBOX_GID), '--hostname', 'sandbox');
    a.push('--die-with-parent', '--new-session', '--cap-drop', 'ALL', '--clearenv');
    for (const [k, v] of Object.entries(spec.env)) a.push('--setenv', k, v);
    a.push('--ro-bind', '/usr', '/usr');
    for (const [target, link] of this.symlinks) a.push('--symlink', target, link);
    a.push('--ro-bind', this.etcDir, '/etc');
    for (const p of this.hostEtc) a.push('--ro-bind', p, p);
    a.push('--proc', '/proc', '--dev', '/dev', '--ro-bind', this.runnerDir, '/runner');
    for (const m of spec.mounts) {
      if (m.type === 'tmpfs') a.push('--perms', '1777', '--size', String(m.sizeBytes), '--tmpfs', m.dest);
      else a.push(m.type === 'ro' ? '--ro-bind' : '--bind', m.src, m.dest);
    }
    // After the run's mounts: these may live below /tmp, which is a fresh tmpfs by now.
    for (const p of this.o.extraRo) a.push('--ro-bind', p, p);
    a.push('--remount-ro', '/', '--chdir', spec.cwd);
    const fdFiles: string[] = [];
    if (this.seccompFile) {
      fdFiles.push(this.seccompFile);
      a.push('--seccomp', '3');
    }
    a.push('--', ...spec.argv);
    return { cmd: a, env: { PATH: HOST_PATH }, fdFiles };
  }

  private runsc(spec: SandboxSpec): { cmd: string[]; env: Record<string, string>; fdFiles: string[]; runscId: string } {
    const rlimits = [
      { type: 'RLIMIT_NOFILE', hard: spec.rlimits.nofile, soft: spec.rlimits.nofile },
      { type: 'RLIMIT_CORE', hard: 0, soft: 0 },
    ];
    if (spec.rlimits.fsize !== undefined) rlimits.push({ type: 'RLIMIT_FSIZE', hard: spec.rlimits.fsize, soft: spec.rlimits.fsize });
    // gVisor counts processes itself; the host pids cgroup also counts the sentry's own threads.
    if (spec.rlimits.nproc !== undefined) rlimits.push({ type: 'RLIMIT_NPROC', hard: spec.rlimits.nproc, soft: spec.rlimits.nproc });
    const mounts: Record<string, unknown>[] = [
      { destination: '/proc', type: 'proc', source: 'proc' },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'noexec', 'mode=755', 'size=65536k'] },
      { destination: '/usr', type: 'bind', source: '/usr', options: ['rbind', 'ro', 'nosuid', 'nodev'] },
      ...this.hostEtc.map((p) => ({ destination: p, type: 'bind', source: p, options: ['rbind', 'ro', 'nosuid', 'nodev'] })),
      { destination: '/runner', type: 'bind', source: this.runnerDir, options: ['rbind', 'ro', 'nosuid', 'nodev'] },
      ...spec.mounts.map((m) =>
        m.type === 'tmpfs'
          ? { destination: m.dest, type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev', 'mode=1777', `size=${m.sizeBytes}`] }
          : { destination: m.dest, type: 'bind', source: m.src, options: ['rbind', m.type, 'nosuid', 'nodev'] },
      ),
      // After the run's mounts: these may live below /tmp, which is a fresh tmpfs by now.
      ...this.o.extraRo.map((p) => ({ destination: p, type: 'bind', source: p, options: ['rbind', 'ro', 'nosuid', 'nodev'] })),
    ];
    const config = {
      ociVersion: '1.0.2',
      process: {
        terminal: false,
        user: { uid: SANDBOX_UID, gid: SANDBOX_GID, additionalGids: [] },
        args: spec.argv,
        env: Object.entries(spec.env).map(([k, v]) => `${k}=${v}`),
        cwd: spec.cwd,
        capabilities: { bounding: [], effective: [], inheritable: [], permitted: [], ambient: [] },
        rlimits,
        noNewPrivileges: true,
      },
      root: { path: this.rootfs, readonly: true },
      hostname: 'sandbox',
      mounts,
      linux: {
        // --network=host uses the network namespace runsc runs in; with a namespace of its own in the
        // spec it would get a new, empty one (no route anywhere).
        namespaces: [{ type: 'pid' }, ...(spec.network ? [] : [{ type: 'network' }]), { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }],
        ...(this.o.seccomp ? { seccomp: ociSeccomp() } : {}),
      },
    };
    writeFileSync(path.join(spec.dir, 'config.json'), JSON.stringify(config));
    const cmd = [
      this.o.bins.runsc ?? 'runsc',
      '--root', this.runscState,
      `--platform=${this.o.gvisorPlatform}`,
      `--network=${spec.network ? 'host' : 'none'}`,
      ...(spec.hostSockets ? ['--host-uds=open'] : []),
      // Limits come from the cgroups the wrapper put runsc in; runsc must not make its own.
      '--ignore-cgroups',
      ...(this.o.seccomp ? ['--oci-seccomp'] : []),
      ...(spec.restoreImage ? ['restore', '--image-path', spec.restoreImage] : ['run']),
      '--bundle', spec.dir, spec.id,
    ];
    return { cmd, env: { PATH: HOST_PATH }, fdFiles: [], runscId: spec.id };
  }

  /** gVisor: the command that checkpoints sandbox `id` into `imageDir` (it stops the sandbox). */
  checkpointCommand(id: string, imageDir: string): string[] {
    return [this.o.bins.runsc ?? 'runsc', '--root', this.runscState, `--platform=${this.o.gvisorPlatform}`, 'checkpoint', '--image-path', imageDir, id];
  }

  private processCmd(spec: SandboxSpec): { cmd: string[]; env: Record<string, string>; fdFiles: string[] } {
    // No isolation at all: the command runs on the host with host paths (see insidePath).
    return { cmd: spec.argv, env: { ...spec.env }, fdFiles: [] };
  }

  /** Makes a host directory writable by the sandbox user. */
  static ownBySandbox(dir: string): void {
    if (process.getuid?.() === 0) chownSync(dir, SANDBOX_UID, SANDBOX_GID);
  }
}

/** `sh` commands that move the shell into the given cgroups, or exit with {@link WRAPPER_FAILED_EXIT}. */
export function enterCgroups(procsFiles: string[]): string {
  for (const f of procsFiles) if (!/^[\w./-]+$/.test(f)) throw new Error(`unsafe cgroup path ${f}`);
  return `{ ${procsFiles.map((f) => `echo $$ > ${f}`).join(' && ')}; } || exit ${WRAPPER_FAILED_EXIT}`;
}


function readIsDir(p: string): boolean {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
}
