/**
 * The one builder of a sandbox's host directory and mounts, used by real runs, dependency installs,
 * the start-up probe and the bare floor: `<runs>/<id>/` with `code/main.py` (ro at /code),
 * `input/data.json` (ro at /input) and `output/` (rw at /output, owned by the sandbox user) when a
 * program runs, and /tmp: a tmpfs of the given size, or for the `process` engine (which has no mount
 * namespace) a private `tmp/` directory owned by the sandbox user.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { SandboxHost, type Mount } from '../sandbox.ts';

/**
 * A sandbox id (runsc container id, cgroup and directory name): `sp-<kind>-<time>-<random>`, or
 * `sp-<time>-<random>` for a run. Unique within a workspace, `[a-z0-9-]` only.
 */
export function sandboxId(kind: string | null, now: number): string {
  return kind ? `sp-${kind}-${now.toString(36)}-${randomBytes(4).toString('hex')}` : `sp-${now.toString(36)}-${randomBytes(5).toString('hex')}`;
}

/** What a run's directory holds for its program: `code/main.py`, `input/data.json`, `input/files/*`. */
export interface Program {
  code: string;
  inputJson: string;
  inputFiles?: readonly { name: string; data: Buffer }[] | undefined;
}

/** Options of {@link RunDir.create}. */
export interface RunDirOptions {
  host: SandboxHost;
  /** Parent directory (the runtime's `runs/`). */
  runsDir: string;
  id: string;
  /**
   * The program and its input; absent for a sandbox that runs no user program (pip); `later` for a
   * warm sandbox: the directories and mounts now, the files at claim ({@link RunDir.writeProgram}).
   */
  program?: Program | 'later';
  /** Size of the /tmp tmpfs, bytes (ignored by the `process` engine). */
  tmpBytes: number;
}

/** A sandbox's host directory and the mounts built on it so far. */
export class RunDir {
  /** Mounts in order; more are added with {@link mount}. */
  readonly mounts: Mount[] = [];

  private constructor(
    readonly host: SandboxHost,
    readonly id: string,
    readonly dir: string,
  ) {}

  /** Creates the directory, writes the program and input, and sets up the standard mounts. */
  static create(o: RunDirOptions): RunDir {
    const rd = new RunDir(o.host, o.id, path.join(o.runsDir, o.id));
    // Not recursive: an id that exists already is refused here, before the cleanup below could
    // remove a directory that is not this one's.
    mkdirSync(rd.dir, { mode: 0o755 });
    try {
      if (o.program) {
        mkdirSync(path.join(rd.dir, 'code'), { mode: 0o755 });
        mkdirSync(path.join(rd.dir, 'input'), { mode: 0o755 });
        mkdirSync(rd.outputDir, { mode: 0o755 });
        if (o.program !== 'later') rd.writeProgram(o.program);
        SandboxHost.ownBySandbox(rd.outputDir);
        rd.mounts.push(
          { type: 'ro', src: path.join(rd.dir, 'code'), dest: '/code' },
          { type: 'ro', src: path.join(rd.dir, 'input'), dest: '/input' },
          { type: 'rw', src: rd.outputDir, dest: '/output' },
        );
      }
      if (o.host.engine === 'process') {
        const tmp = path.join(rd.dir, 'tmp');
        mkdirSync(tmp, { mode: 0o700 });
        SandboxHost.ownBySandbox(tmp);
        rd.mounts.push({ type: 'rw', src: tmp, dest: '/tmp' });
      } else {
        rd.mounts.push({ type: 'tmpfs', dest: '/tmp', sizeBytes: o.tmpBytes });
      }
    } catch (err) {
      rd.remove();
      throw err;
    }
    return rd;
  }

  /** Writes `code/main.py` and `input/data.json` (at creation, or at a warm sandbox's claim). */
  writeProgram(program: Program): void {
    writeFileSync(path.join(this.dir, 'code', 'main.py'), program.code, { mode: 0o644 });
    writeFileSync(path.join(this.dir, 'input', 'data.json'), program.inputJson, { mode: 0o644 });
    // `input/files/`: replaced whole, so a warm sandbox given another program keeps none of the first's.
    const files = path.join(this.dir, 'input', 'files');
    rmSync(files, { recursive: true, force: true });
    if (program.inputFiles?.length) {
      mkdirSync(files, { mode: 0o755 });
      // Names are plain file names (checked at submission); `wx` never follows or replaces anything.
      for (const f of program.inputFiles) writeFileSync(path.join(files, f.name), f.data, { mode: 0o644, flag: 'wx' });
    }
  }

  /** Host path of `/output`. */
  get outputDir(): string {
    return path.join(this.dir, 'output');
  }

  /** Adds a mount after the standard ones. */
  mount(m: Mount): void {
    this.mounts.push(m);
  }

  /** Creates a subdirectory of the run directory (mode 755) and returns its host path. */
  subdir(name: string): string {
    const d = path.join(this.dir, name);
    mkdirSync(d, { mode: 0o755 });
    return d;
  }

  /** Where the command sees a path mounted at `dest` (the host path for the `process` engine). */
  at(dest: string): string {
    return this.host.insidePath({ mounts: this.mounts }, dest);
  }

  /** Removes the directory and everything in it. */
  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
