/**
 * Warm gVisor sandboxes restored from a checkpoint (issue 18 item 3; docs/warm-restore.md).
 *
 * Booting a preloaded gVisor sandbox costs seconds (the sentry, the interpreter, the imports); a
 * pool that refills that way drains under steady load. With `warm_pool.restore`, the first sandbox
 * of a pool key is a template: it boots as any warm sandbox does and, once its runner says `ready`
 * (preloads imported, the program's process held), it is checkpointed (`runsc checkpoint`, which
 * stops it) into an image of its own key. Every later sandbox of that key is restored from the image
 * (`runsc restore`, SandboxHost.launch with `restoreImage`): a new container with its own id, run
 * directory (the bundle's mounts name the new directories; the gofer reopens them by path), cgroup
 * and pipes (runsc hands the restored process the new stdin and stdout), which says `ready` again
 * when the host's `ping` reaches it. At the go the program's process reseeds its generators
 * (runner.py `reseed`), so no two restored sandboxes share a random sequence.
 *
 * A key whose checkpoint or restore fails falls back to booting (logged once), so the pool never
 * depends on restore working. Images live for the process (under the instance's `images/`,
 * emptied at start) and go with their key.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { errorMessage } from '../../../errors.ts';
import type { Logger } from '../../../logger.ts';

/** Where a key's image stands. */
export type ImageState = { state: 'making' } | { state: 'ready'; dir: string } | { state: 'failed'; why: string };

/** How the next sandbox of a key starts. */
export type StartHow = { how: 'boot' } | { how: 'template' } | { how: 'wait' } | { how: 'restore'; image: string };

/**
 * The decision (pure): restore from a ready image; without an image, boot one template and let the
 * other starts of the key wait for it (they would cost the boot the image saves); after a failure,
 * boot as if restore were off.
 */
export function startHow(image: ImageState | undefined): StartHow {
  if (!image) return { how: 'template' };
  if (image.state === 'ready') return { how: 'restore', image: image.dir };
  if (image.state === 'making') return { how: 'wait' };
  return { how: 'boot' };
}

/** Options of {@link RestoreImages}. */
export interface RestoreImagesOptions {
  /** Directory for the images (emptied now). */
  dir: string;
  /** The command that checkpoints container `id` into `imageDir` (SandboxHost.checkpointCommand). */
  checkpointCommand(id: string, imageDir: string): string[];
  log: Logger;
  /** Longest wait for one checkpoint. */
  timeoutMs?: number;
}

/** The checkpoint images of the pool's keys; see the file header. */
export class RestoreImages {
  private readonly images = new Map<string, ImageState>();

  constructor(private readonly o: RestoreImagesOptions) {
    rmSync(o.dir, { recursive: true, force: true });
    mkdirSync(o.dir, { recursive: true, mode: 0o700 });
  }

  /** How the next sandbox of `key` starts; a `template` answer marks the key's image as being made. */
  next(key: string): StartHow {
    const h = startHow(this.images.get(key));
    if (h.how === 'template') this.images.set(key, { state: 'making' });
    return h;
  }

  /** Checkpoints the template `runscId` of `key` (it stops); true when the key can restore from now on. */
  async checkpoint(key: string, runscId: string): Promise<boolean> {
    const dir = path.join(this.o.dir, createHash('sha256').update(key).digest('hex').slice(0, 16));
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { mode: 0o700 });
    const [file, ...args] = this.o.checkpointCommand(runscId, dir);
    const started = Date.now();
    try {
      await new Promise<void>((resolve, reject) =>
        execFile(file!, args, { timeout: this.o.timeoutMs ?? 60_000 }, (err, _out, stderr) => (err ? reject(new Error(`${errorMessage(err)} ${String(stderr).trim()}`.trim())) : resolve())),
      );
    } catch (err) {
      rmSync(dir, { recursive: true, force: true });
      this.failed(key, `checkpoint failed: ${errorMessage(err)}`);
      return false;
    }
    if (this.images.get(key)?.state !== 'making') {
      // Dropped (or failed) meanwhile: the image has no key any more.
      rmSync(dir, { recursive: true, force: true });
      return false;
    }
    this.images.set(key, { state: 'ready', dir });
    this.o.log.info({ pool: key, checkpoint_ms: Date.now() - started }, 'warm sandboxes of this key are restored from a checkpoint from now on');
    return true;
  }

  /** The template of `key` ended before its checkpoint: the next start makes a template again. */
  templateLost(key: string): void {
    if (this.images.get(key)?.state === 'making') this.images.delete(key);
  }

  /** Restore (or the checkpoint) does not work for `key`: it boots from now on. */
  failed(key: string, why: string): void {
    const was = this.images.get(key);
    if (was?.state === 'ready') rmSync(was.dir, { recursive: true, force: true });
    if (was?.state !== 'failed') this.o.log.warn({ pool: key, detail: why.slice(-2000) }, 'cannot restore warm sandboxes of this key: they boot');
    this.images.set(key, { state: 'failed', why });
  }

  /** Forgets `key` and removes its image (the key is no target any more). */
  drop(key: string): void {
    const was = this.images.get(key);
    if (was?.state === 'ready') rmSync(was.dir, { recursive: true, force: true });
    this.images.delete(key);
  }

  /** Removes every image. */
  clear(): void {
    for (const key of [...this.images.keys()]) this.drop(key);
  }

  /** Keys and their states (tests, stats). */
  states(): ReadonlyMap<string, ImageState> {
    return this.images;
  }
}
