/**
 * The build's registry path against a real OCI registry (Debian's docker-registry, started here on a
 * loopback port with temporary storage): a base image is pushed, the build's layer composed on top
 * and pushed by digest; skopeo reads what the registry holds and umoci unpacks it to check the files.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ENV_SITE, composeConfig, pushImage, sha256Digest, type ImageConfig } from '../../../src/runtime/kubernetes/builds/build-image.ts';
import { writeLayer, type TreeEntry } from '../../../src/runtime/kubernetes/builds/build-layer.ts';
import { MEDIA, RegistryClient, RegistryError } from '../../../src/runtime/kubernetes/builds/build-registry.ts';
import { hasRegistry, hasSkopeo, hasUmoci, pushBase, startRegistry, type TestRegistry } from '../../support/oci-registry.ts';

const file = (name: string, s: string, executable = false): TreeEntry => ({ type: 'file', name, size: Buffer.byteLength(s), executable, source: { data: Buffer.from(s) } });

describe.skipIf(!hasRegistry)('build image push to a real registry (docker-registry)', () => {
  let reg: TestRegistry;
  let work: string;

  beforeAll(async () => {
    reg = await startRegistry();
    work = mkdtempSync(path.join(tmpdir(), 'build-registry-'));
  });
  afterAll(async () => {
    await reg?.stop();
    rmSync(work, { recursive: true, force: true });
  });

  it('pushes the layer on top of the base by digest; the registry serves exactly that image', async () => {
    const client = new RegistryClient(reg.host, { insecure: true });
    const base = await pushBase(client, work, 'sandpod/executor');
    const got = await client.getImage('sandpod/executor', 'v1', 'linux/amd64');
    expect(got.digest).toBe(base.digest);

    const tree: TreeEntry[] = [
      { type: 'directory', name: 'site' },
      file('site/tinypkg/__init__.py', 'VALUE = 42\n'),
      file('site/bin/tool', '#!/bin/sh\necho hi\n', true),
      { type: 'symlink', name: 'site/tinypkg/alias.py', target: '__init__.py' },
      file('requirements.lock', 'tinypkg==1.0.0 --hash=sha256:00\n'),
    ];
    const layer = await writeLayer(tree, 'sandpod-env', path.join(work, 'layer.tar.gz'));
    const digest = await pushImage({
      client,
      baseRepository: 'sandpod/executor',
      base: { mediaType: got.mediaType, manifest: got.manifest, config: base.config },
      repository: 'sandpod/builds/data',
      tag: 'sha256-abc',
      layer,
      labels: { jobType: 'data', envDigest: 'ab'.repeat(32) },
    });
    expect(digest).toMatch(/^sha256:[a-f0-9]{64}$/);

    // The registry has it under its digest and under the tag; the base layer was mounted, not lost.
    const byDigest = await client.getImage('sandpod/builds/data', digest, 'linux/amd64');
    expect(byDigest.mediaType).toBe(MEDIA.dockerManifest);
    expect(byDigest.manifest.layers.map((l) => l.digest)).toEqual([base.manifest.layers[0]!.digest, layer.digest]);
    expect((await client.getManifest('sandpod/builds/data', 'sha256-abc')).digest).toBe(digest);
    expect(await client.hasBlob('sandpod/builds/data', base.manifest.layers[0]!.digest)).toBe(true);

    // Pushing the same thing again is the same digest (and uploads nothing new).
    const again = await pushImage({
      client,
      baseRepository: 'sandpod/executor',
      base: { mediaType: got.mediaType, manifest: got.manifest, config: base.config },
      repository: 'sandpod/builds/data',
      tag: 'sha256-abc',
      layer,
      labels: { jobType: 'data', envDigest: 'ab'.repeat(32) },
    });
    expect(again).toBe(digest);

    const cfg = JSON.parse((await client.getBlob('sandpod/builds/data', byDigest.manifest.config.digest)).toString()) as ImageConfig;
    expect(cfg.config?.Env).toContain(`PYTHONPATH=${ENV_SITE}:/opt/lib`);
    expect(cfg.rootfs?.diff_ids).toEqual([...base.config.rootfs!.diff_ids!, layer.diffId]);
    expect(cfg.config?.Cmd).toEqual(['python3']);
  });

  it.skipIf(!hasSkopeo || !hasUmoci)('skopeo reads it and umoci unpacks the files with fixed owners, modes and times', async () => {
    const client = new RegistryClient(reg.host, { insecure: true });
    const base = await client.getImage('sandpod/executor', 'v1', 'linux/amd64');
    const baseConfig = JSON.parse((await client.getBlob('sandpod/executor', base.manifest.config.digest)).toString()) as ImageConfig;
    const layer = await writeLayer([file('site/pkg/__init__.py', 'X = 1\n'), file('build.json', '{}\n')], 'sandpod-env', path.join(work, 'l2.tar.gz'));
    const digest = await pushImage({
      client,
      baseRepository: 'sandpod/executor',
      base: { mediaType: base.mediaType, manifest: base.manifest, config: baseConfig },
      repository: 'sandpod/builds/other',
      tag: 'env',
      layer,
      labels: { jobType: 'other', envDigest: 'cd'.repeat(32) },
    });
    const inspect = JSON.parse(execFileSync('skopeo', ['inspect', '--tls-verify=false', `docker://${reg.host}/sandpod/builds/other@${digest}`], { encoding: 'utf8' })) as {
      Digest: string;
      Layers: string[];
      Labels: Record<string, string>;
      Env: string[];
    };
    expect(inspect.Digest).toBe(digest);
    expect(inspect.Layers).toEqual([base.manifest.layers[0]!.digest, layer.digest]);
    expect(inspect.Labels['io.sandpod.job-type']).toBe('other');
    expect(inspect.Env).toContain(`PYTHONPATH=${ENV_SITE}:/opt/lib`);

    const oci = path.join(work, 'oci');
    execFileSync('skopeo', ['copy', '--quiet', '--src-tls-verify=false', `docker://${reg.host}/sandpod/builds/other@${digest}`, `oci:${oci}:x`]);
    const bundle = path.join(work, 'bundle');
    execFileSync('umoci', ['unpack', '--rootless', '--image', `${oci}:x`, bundle], { stdio: 'ignore' });
    const rootfs = path.join(bundle, 'rootfs');
    expect(readFileSync(path.join(rootfs, 'base/hello.txt'), 'utf8')).toBe('from the base\n');
    expect(readFileSync(path.join(rootfs, 'sandpod-env/site/pkg/__init__.py'), 'utf8')).toBe('X = 1\n');
    const st = statSync(path.join(rootfs, 'sandpod-env/site/pkg/__init__.py'));
    expect(st.mode & 0o777).toBe(0o644);
    expect(st.mtimeMs).toBe(0);
    expect(statSync(path.join(rootfs, 'sandpod-env/site')).mode & 0o777).toBe(0o755);
  });

  it('Basic authentication: refused without credentials, accepted with them', async () => {
    const authed = await startRegistry({ username: 'builder', password: 's3cret-pass' });
    try {
      const anon = new RegistryClient(authed.host, { insecure: true });
      await expect(anon.uploadBlob('x/y', sha256Digest(Buffer.from('a')), Buffer.from('a'))).rejects.toThrow(/asks for credentials and none are configured/);
      const wrong = new RegistryClient(authed.host, { insecure: true, credentials: { username: 'builder', password: 'nope' } });
      await expect(wrong.hasBlob('x/y', sha256Digest(Buffer.from('a')))).rejects.toBeInstanceOf(RegistryError);
      const ok = new RegistryClient(authed.host, { insecure: true, credentials: { username: 'builder', password: 's3cret-pass' } });
      await ok.uploadBlob('x/y', sha256Digest(Buffer.from('a')), Buffer.from('a'));
      expect(await ok.hasBlob('x/y', sha256Digest(Buffer.from('a')))).toBe(true);
    } finally {
      await authed.stop();
    }
  });

  it('a blob whose bytes do not match its digest is refused by the registry', async () => {
    const client = new RegistryClient(reg.host, { insecure: true });
    await expect(client.uploadBlob('sandpod/bad', sha256Digest(Buffer.from('one')), Buffer.from('two'))).rejects.toThrow(/HTTP 400/);
  });

  it('composeConfig is what was pushed (same bytes, same digest)', () => {
    const a = composeConfig({ config: { Env: ['A=1'] }, rootfs: { type: 'layers', diff_ids: ['sha256:1'] } }, { diffId: 'sha256:2' }, { jobType: 't', envDigest: 'e' });
    const b = composeConfig({ rootfs: { diff_ids: ['sha256:1'], type: 'layers' }, config: { Env: ['A=1'] } }, { diffId: 'sha256:2' }, { jobType: 't', envDigest: 'e' });
    expect(sha256Digest(a)).toBe(sha256Digest(b));
  });
});
