/**
 * The restore decision of the local pool (pool/restore-images.ts): template first, the others of the
 * key wait for its image, then restore; after a failure, boot. And the image bookkeeping around it.
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../../../src/logger.ts';
import { RestoreImages, startHow, type ImageState } from '../../../../../src/runtime/local/pool/restore-images.ts';

describe('startHow', () => {
  it.each<[string, ImageState | undefined, ReturnType<typeof startHow>]>([
    ['no image yet: boot the template', undefined, { how: 'template' }],
    ['the template is being made: wait for it', { state: 'making' }, { how: 'wait' }],
    ['an image: restore from it', { state: 'ready', dir: '/x' }, { how: 'restore', image: '/x' }],
    ['checkpoint or restore failed: boot', { state: 'failed', why: 'no' }, { how: 'boot' }],
  ])('%s', (_name, state, want) => {
    expect(startHow(state)).toEqual(want);
  });
});

describe('RestoreImages', () => {
  const make = (cmd: (id: string, dir: string) => string[]) => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const dir = path.join(mkdtempSync(path.join('/tmp/sandpod-test', 'images-')), 'images');
    return { dir, images: new RestoreImages({ dir, checkpointCommand: cmd, log: silentLogger }) };
  };

  it('marks the key as making on the template answer, so a second start waits; a good checkpoint makes it restore', async () => {
    const { images } = make((_id, d) => ['/bin/sh', '-c', `echo img > ${d}/checkpoint.img`]);
    expect(images.next('k')).toEqual({ how: 'template' });
    expect(images.next('k')).toEqual({ how: 'wait' });
    expect(await images.checkpoint('k', 'c1')).toBe(true);
    const how = images.next('k');
    expect(how.how).toBe('restore');
    expect(readdirSync((how as { image: string }).image)).toEqual(['checkpoint.img']);
  });

  it('a failed checkpoint makes the key boot from then on, and leaves no image', async () => {
    const { images, dir } = make(() => ['/bin/sh', '-c', 'echo nope >&2; exit 3']);
    images.next('k');
    expect(await images.checkpoint('k', 'c1')).toBe(false);
    expect(images.next('k')).toEqual({ how: 'boot' });
    expect(images.states().get('k')).toMatchObject({ state: 'failed', why: expect.stringContaining('nope') });
    expect(readdirSync(dir)).toEqual([]);
  });

  it('a template lost before its checkpoint lets the next start make one again; drop removes the image', async () => {
    const { images } = make((_id, d) => ['/bin/sh', '-c', `echo img > ${d}/checkpoint.img`]);
    images.next('k');
    images.templateLost('k');
    expect(images.next('k')).toEqual({ how: 'template' });
    await images.checkpoint('k', 'c1');
    const image = (images.next('k') as { image: string }).image;
    images.drop('k');
    expect(existsSync(image)).toBe(false);
    expect(images.next('k')).toEqual({ how: 'template' });
  });

  it('a key dropped while its checkpoint ran gets no image', async () => {
    const { images, dir } = make((_id, d) => ['/bin/sh', '-c', `sleep 0.2; echo img > ${d}/checkpoint.img`]);
    images.next('k');
    const p = images.checkpoint('k', 'c1');
    images.drop('k');
    expect(await p).toBe(false);
    expect(readdirSync(dir)).toEqual([]);
  });
});
