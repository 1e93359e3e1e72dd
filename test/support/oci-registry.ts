/**
 * A real OCI registry for tests: Debian's `docker-registry` (the CNCF distribution registry), started
 * on a free loopback port with temporary storage, optionally with htpasswd (Basic) authentication.
 * `apt-get install docker-registry` provides it; tests skip visibly without it.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { sha256Digest, type ImageConfig } from '../../src/runtime/kubernetes/builds/build-image.ts';
import { writeLayer } from '../../src/runtime/kubernetes/builds/build-layer.ts';
import { MEDIA, type ImageManifest, type RegistryClient } from '../../src/runtime/kubernetes/builds/build-registry.ts';

export const REGISTRY_BIN = '/usr/bin/docker-registry';
export const hasRegistry = existsSync(REGISTRY_BIN);
export const hasSkopeo = existsSync('/usr/bin/skopeo');
export const hasUmoci = existsSync('/usr/bin/umoci');

export interface TestRegistry {
  /** `127.0.0.1:<port>` */
  host: string;
  dir: string;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

/** Starts a registry; with `auth`, Basic authentication with that one user (bcrypt via Python's crypt). */
export async function startRegistry(auth?: { username: string; password: string }): Promise<TestRegistry> {
  const dir = mkdtempSync(path.join(tmpdir(), 'oci-registry-'));
  const port = await freePort();
  let authBlock = '';
  if (auth) {
    const hash = execFileSync('python3', ['-W', 'ignore', '-c', 'import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))', auth.password], { encoding: 'utf8' }).trim();
    writeFileSync(path.join(dir, 'htpasswd'), `${auth.username}:${hash}\n`);
    authBlock = `auth:\n  htpasswd:\n    realm: test\n    path: ${path.join(dir, 'htpasswd')}\n`;
  }
  writeFileSync(
    path.join(dir, 'config.yml'),
    `version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: ${path.join(dir, 'data')}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:${port}\n${authBlock}`,
  );
  const proc: ChildProcess = spawn(REGISTRY_BIN, ['serve', path.join(dir, 'config.yml')], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr?.on('data', (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-4000);
  });
  const host = `127.0.0.1:${port}`;
  const until = Date.now() + 15_000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`docker-registry exited: ${stderr}`);
    const ok = await fetch(`http://${host}/v2/`).then((r) => r.status === 200 || r.status === 401, () => false);
    if (ok) break;
    if (Date.now() > until) throw new Error(`docker-registry did not answer: ${stderr}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    host,
    dir,
    stop: async () => {
      if (proc.exitCode === null) {
        const exited = new Promise((r) => proc.once('exit', r));
        proc.kill('SIGTERM');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Pushes a one-layer base image (Docker schema 2, as skopeo pushes kcluster's images) and returns its pieces. */
export async function pushBase(client: RegistryClient, work: string, repository: string): Promise<{ digest: string; manifest: ImageManifest; config: ImageConfig }> {
  const layer = await writeLayer([{ type: 'file', name: 'hello.txt', size: 14, executable: false, source: { data: Buffer.from('from the base\n') } }], 'base', path.join(work, 'base.tar.gz'));
  await client.uploadBlob(repository, layer.digest, { file: layer.file });
  const config: ImageConfig = {
    architecture: 'amd64',
    os: 'linux',
    config: { Env: ['PATH=/usr/bin:/bin', 'PYTHONPATH=/opt/lib'], Cmd: ['python3'] },
    rootfs: { type: 'layers', diff_ids: [layer.diffId] },
    history: [{ created_by: 'test base' }],
  };
  const configBytes = Buffer.from(JSON.stringify(config));
  await client.uploadBlob(repository, sha256Digest(configBytes), configBytes);
  const manifest: ImageManifest = {
    schemaVersion: 2,
    mediaType: MEDIA.dockerManifest,
    config: { mediaType: MEDIA.dockerConfig, digest: sha256Digest(configBytes), size: configBytes.length },
    layers: [{ mediaType: MEDIA.dockerLayerGzip, digest: layer.digest, size: layer.size }],
  };
  const digest = await client.putManifest(repository, 'v1', MEDIA.dockerManifest, Buffer.from(JSON.stringify(manifest)));
  return { digest, manifest, config };
}

