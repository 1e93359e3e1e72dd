/**
 * The install sandbox: where `pip install` runs, for a run's requirements (deps.ts) and for a job
 * type's build (build.ts). pip runs the build steps of what it installs (`setup.py`, a PEP 517
 * backend), code we did not write, so an install is a sandbox like a run's (issue 22): read-only
 * root, uid 1000, its own cgroup, and:
 *
 * - **Network**: its own network namespace (bubblewrap `--unshare-net`, runsc `--network=none`),
 *   whose only way out is an egress proxy (src/egress/proxy.ts, the one runs with `allowed_hosts`
 *   use) on a Unix socket, relayed into the sandbox by runner.py's `--egress-proxy`, exactly as for
 *   such a run. That is why pip is started by the runner ({@link INSTALL_PROGRAM} calls pip's main):
 *   one relay, one proxy, not a second of either. The proxy lets through only the hosts of the
 *   configured package indexes ({@link installAllowedHosts}); a name that resolves to a loopback,
 *   private or link-local address is refused, an address written literally in a configured URL is
 *   allowed on that port (the operator named it). A `find_links` directory is bound read-only
 *   (engine-probe.ts); it needs no network. The `process` engine isolates nothing: pip runs on the
 *   host's network, as its runs do.
 * - **Cache (the trust model)**: nothing an install writes reaches a later install. pip runs with
 *   `--no-cache-dir`: what it downloads and the wheels it builds live in the sandbox's own /tmp, a
 *   tmpfs thrown away with it. A shared cache, even one filled only by the service, would hold
 *   wheels built from sdists, whose content no index hash vouches for (the package's own build code
 *   made them), so it is not kept at all. What is shared is the finished environment (deps.ts), and
 *   only with runs asking for the same requirements and pip settings. The cost: a new requirement set
 *   downloads its archives again.
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { Logger } from '../../../logger.ts';
import type { CgroupSupport } from '../cgroups.ts';
import type { Installer } from './deps.ts';
import { EgressProxy } from '../runs/egress-proxy.ts';
import { runscDelete, superviseLaunch } from '../runs/proc.ts';
import { RunDir, sandboxId } from '../runs/run-dir.ts';
import { programEnv } from '../runs/runner-command.ts';
import { EGRESS_DIR, type SandboxHost } from '../sandbox.ts';

/** Bytes of pip's output kept for a dependency error. */
const PIP_TAIL = 4000;
/** Limits of an install sandbox (pip and a build backend need room; it is not user code). */
const INSTALL_LIMITS = { memoryBytes: 2 * 1024 ** 3, pids: 4096, cpus: 2 } as const;
/** Longest Unix socket path (sockaddr_un.sun_path, less its NUL). */
const MAX_UNIX_PATH = 107;
/** Environment of pip (besides the runner's PATH, HOME, TMPDIR, LANG). */
const PIP_ENV = { PIP_NO_COLOR: '1', PYTHONDONTWRITEBYTECODE: '1' } as const;
/** pip's default index and the host its files are served from. */
const PYPI = { index: 'https://pypi.org/simple/', files: 'files.pythonhosted.org:443' } as const;
/** pip options in `extra_args` whose value is an index or find-links URL. */
const URL_OPTIONS = new Set(['--index-url', '-i', '--extra-index-url', '--find-links', '-f']);

/**
 * The program the runner runs in an install sandbox: pip's main, with the argv (a JSON list) from
 * the input file beside the program's directory (`/input/data.json`, or the run directory's
 * `input/` on the `process` engine).
 */
export const INSTALL_PROGRAM = `import json, os, runpy, sys
with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'input', 'data.json')) as f:
    args = json.load(f)
sys.argv = ['pip'] + args
runpy.run_module('pip', run_name='__main__', alter_sys=True)
`;

/** What an install sandbox needs from the started runtime. */
export interface InstallContext {
  host: SandboxHost;
  cgroups: CgroupSupport | null;
  runsDir: string;
  pip: Config['pip'];
  /** runsc binary (gVisor only): a killed install's container is deleted with it. */
  runsc: string | null;
  clock: Clock;
  /** Where refused egress of an install is logged. */
  log?: Logger;
  /** Runs housekeeping off the caller's path. */
  background(p: Promise<unknown>): void;
}

/** Extras of a build's install (build.ts): pip's report and a lock file, both in `workDir`. */
export interface InstallExtras {
  /** Host directory (owned by the sandbox user) mounted read-write at `/build-work`. */
  workDir: string;
  /** Ask pip for `--report /build-work/report.json` (what was resolved, with archive hashes). */
  report: boolean;
  /** Install exactly `/build-work/<lockFile>` (`--no-deps --require-hashes -r`), nothing else. */
  lockFile?: string;
}

/** `host:port` of an http(s) URL, as an egress pattern; null for anything else (a path, file://). */
export function urlHostPattern(raw: string): string | null {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return null;
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return null;
  if (u.hostname === '') return null;
  return `${u.hostname}:${u.port || (u.protocol === 'https:' ? 443 : 80)}`;
}

/**
 * The egress patterns of an install: the host and port of each package index pip is configured to
 * use (`index_url`, PyPI and its file host when unset, unless `no_index`), of each http(s)
 * `find_links`, of the index and find-links URLs in `extra_args`, and `allowed_hosts` as given.
 */
export function installAllowedHosts(pip: Config['pip']): string[] {
  const urls: string[] = [...pip.find_links];
  const out: string[] = [];
  if (!pip.no_index) {
    urls.push(pip.index_url ?? PYPI.index);
    if (!pip.index_url) out.push(PYPI.files);
  }
  const args = pip.extra_args;
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    const eq = a.indexOf('=');
    if (eq > 0 && URL_OPTIONS.has(a.slice(0, eq))) urls.push(a.slice(eq + 1));
    else if (URL_OPTIONS.has(a) && i + 1 < args.length) urls.push(args[++i]!);
  }
  for (const u of urls) {
    const p = urlHostPattern(u);
    if (p) out.push(p);
  }
  out.push(...pip.allowed_hosts);
  return [...new Set(out)];
}

/** pip's command line for an install into `/deps-build` (paths as the sandbox sees them). */
function pipArgs(rd: RunDir, pip: Config['pip'], reqs: string[], extras?: InstallExtras): string[] {
  const buildArgs = !extras
    ? []
    : [
        ...(extras.report ? ['--report', rd.at('/build-work/report.json')] : []),
        ...(extras.lockFile ? ['--no-deps', '--require-hashes', '-r', rd.at(`/build-work/${extras.lockFile}`)] : []),
      ];
  return [
    'install',
    '--target', rd.at('/deps-build'),
    // No cache shared between installs: see the trust model in the header.
    '--no-cache-dir',
    '--disable-pip-version-check', '--no-input', '--no-warn-script-location', '--progress-bar', 'off',
    ...(pip.index_url ? ['--index-url', pip.index_url] : []),
    ...pip.find_links.flatMap((f) => ['--find-links', f]),
    ...(pip.no_index ? ['--no-index'] : []),
    ...pip.extra_args,
    ...buildArgs,
    ...reqs,
  ];
}

/**
 * An {@link Installer} that runs `pip install --target` with `interpreter` in an install sandbox of
 * the runtime's engine (see the header: network only through the egress proxy to the configured
 * indexes, no shared cache), uid 1000, its own cgroup. With `extras` (builds), pip also writes its
 * resolution report, or installs a hash-pinned lock file.
 */
export function sandboxInstaller(ctx: InstallContext, interpreter: string, extras?: InstallExtras): Installer {
  return async (target, reqs, deadline, signal) => {
    const host = ctx.host;
    const rd = RunDir.create({ host, runsDir: ctx.runsDir, id: sandboxId('deps', ctx.clock.now()), program: 'later', tmpBytes: INSTALL_LIMITS.memoryBytes });
    const cgroup = ctx.cgroups?.create(rd.id, INSTALL_LIMITS) ?? null;
    let proxy: EgressProxy | null = null;
    let netDir: string | null = null;
    try {
      rd.mount({ type: 'rw', src: target, dest: '/deps-build' });
      if (extras) rd.mount({ type: 'rw', src: extras.workDir, dest: '/build-work' });
      if (host.engine !== 'process') {
        // The socket's own short directory: a run directory's path can exceed what a Unix socket takes.
        netDir = mkdtempSync(path.join(tmpdir(), 'sandpod-install-'));
        chmodSync(netDir, 0o755);
        const socketPath = path.join(netDir, 'proxy.sock');
        if (Buffer.byteLength(socketPath) > MAX_UNIX_PATH) {
          return { ok: false, output: `the temporary directory's path is too long for the install's egress proxy socket (${socketPath}); set TMPDIR to a shorter one`, timedOut: false, cancelled: false };
        }
        const allowedHosts = installAllowedHosts(ctx.pip);
        proxy = await EgressProxy.listen(socketPath, {
          allowedHosts,
          onDecision: (d) => {
            if (!d.allowed) ctx.log?.warn({ sandbox: rd.id, host: d.host, port: d.port, reason: d.reason }, 'install egress refused');
          },
        });
        rd.mount({ type: 'ro', src: netDir, dest: EGRESS_DIR });
      }
      rd.writeProgram({ code: INSTALL_PROGRAM, inputJson: JSON.stringify(pipArgs(rd, ctx.pip, reqs, extras)) });
      const tmp = rd.at('/tmp');
      const argv = [
        interpreter, rd.at(host.runnerFor(interpreter)),
        '--code', rd.at('/code/main.py'),
        '--input', rd.at('/input/data.json'),
        '--output', rd.at('/output'),
        // The deadline is this runtime's; the runner's own limit only backs it up.
        '--timeout', String(Math.max(1, Math.ceil((deadline - ctx.clock.now()) / 1000) + 60)),
        '--max-stream-bytes', String(PIP_TAIL),
        // pip's output, uncapped, on the runner's stdout/stderr: the tails below are the dependency error.
        '--tee',
        ...(proxy ? ['--egress-proxy', `${EGRESS_DIR}/proxy.sock`] : []),
        ...Object.entries(PIP_ENV).map(([k, v]) => `--env=${k}=${v}`),
        ...(host.engine === 'process' ? ['--cwd', tmp, '--tmp', tmp] : []),
      ];
      const launch = host.launch({
        id: rd.id,
        dir: rd.dir,
        argv,
        env: programEnv([], PIP_ENV, tmp),
        cwd: '/tmp',
        mounts: rd.mounts,
        // No network of its own on a real engine: only the proxy's socket.
        network: proxy === null,
        ...(proxy ? { hostSockets: true } : {}),
        rlimits: { nofile: 4096 },
        procsFiles: cgroup?.procsFiles ?? [],
      });
      const res = await superviseLaunch(launch, { clock: ctx.clock, startupDeadline: deadline, timeoutMs: 0, signal, collectStdout: true, kill: () => cgroup?.killAll() });
      if (res.killedBy && launch.runscId && ctx.runsc) ctx.background(runscDelete(ctx.runsc, host.runscState, [launch.runscId]));
      const output = (res.stdoutTail + res.stderrTail).trim();
      return {
        ok: !res.killedBy && !res.spawnError && res.exitCode === 0,
        output: res.spawnError ? `cannot start the install sandbox: ${res.spawnError}` : output.slice(-PIP_TAIL),
        timedOut: res.killedBy === 'deadline',
        cancelled: res.killedBy === 'abort',
      };
    } finally {
      const closing = proxy?.close();
      ctx.background(
        (async () => {
          await closing;
          await cgroup?.remove();
          rd.remove();
          if (netDir) rmSync(netDir, { recursive: true, force: true });
        })(),
      );
    }
  };
}
