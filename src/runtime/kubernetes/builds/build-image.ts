/**
 * A built job type's image: the executor image plus one layer holding the installed requirements,
 * composed the way `crane append`/ko do it, as pure functions (table-tested) plus one push.
 *
 * - config: the base's, with the layer's diff id appended to `rootfs.diff_ids`, a history entry for
 *   it, `PYTHONPATH` pointing at the layer's site directory (runs pass the same directory to the
 *   runner's `--python-path`, which starts from a clean environment), and labels naming the build;
 * - manifest: the base's media type family (Docker schema 2 or OCI) with the base's layers and the
 *   new one; pushed by digest and tagged with the environment digest so it can be found again.
 *
 * Base layers are mounted from the executor image's repository when both live in the build
 * registry (the usual set-up); from another registry they are copied through this process, one
 * layer in memory at a time.
 */
import { canonical } from '../../../util/json.ts';
import { MEDIA, type Descriptor, type ImageManifest, type RegistryClient } from './build-registry.ts';
import type { LayerBlob } from './build-layer.ts';
import { createHash } from 'node:crypto';

/** Where the layer puts the environment in the image (not under `/sandpod`: runs mount the runner there). */
export const ENV_ROOT = 'sandpod-env';
/** The directory runs put on PYTHONPATH. */
export const ENV_SITE = `/${ENV_ROOT}/site`;

/** The parts of an image config we touch; everything else is kept as the base has it. */
export interface ImageConfig {
  config?: { Env?: string[]; Labels?: Record<string, string>; [k: string]: unknown };
  rootfs?: { type?: string; diff_ids?: string[] };
  history?: { created?: string; created_by?: string; comment?: string; empty_layer?: boolean }[];
  [k: string]: unknown;
}

/** What names the build in the image. */
export interface BuildLabels {
  jobType: string;
  envDigest: string;
}

/** The new image config (bytes: canonical JSON, so the same inputs give the same digest). */
export function composeConfig(base: ImageConfig, layer: Pick<LayerBlob, 'diffId'>, labels: BuildLabels): Buffer {
  const cfg: ImageConfig = JSON.parse(JSON.stringify(base)) as ImageConfig;
  const inner = { ...(cfg.config ?? {}) };
  const env = (inner.Env ?? []).filter((e) => !e.startsWith('PYTHONPATH='));
  const prior = (inner.Env ?? []).find((e) => e.startsWith('PYTHONPATH='))?.slice('PYTHONPATH='.length);
  env.push(`PYTHONPATH=${prior ? `${ENV_SITE}:${prior}` : ENV_SITE}`);
  inner.Env = env;
  inner.Labels = { ...(inner.Labels ?? {}), 'io.sandpod.job-type': labels.jobType, 'io.sandpod.environment': `sha256:${labels.envDigest}` };
  cfg.config = inner;
  cfg.rootfs = { type: 'layers', diff_ids: [...(cfg.rootfs?.diff_ids ?? []), layer.diffId] };
  cfg.history = [...(cfg.history ?? []), { created: '1970-01-01T00:00:00Z', created_by: `sandpod job-type build ${labels.jobType}`, comment: `environment sha256:${labels.envDigest}` }];
  return Buffer.from(canonical(cfg));
}

/** The manifest of the new image: the base's layers plus `layer`, in the base's media type family. */
export function composeManifest(baseMediaType: string, base: ImageManifest, config: { digest: string; size: number }, layer: Pick<LayerBlob, 'digest' | 'size'>): { mediaType: string; body: Buffer } {
  const docker = baseMediaType === MEDIA.dockerManifest;
  const mediaType = docker ? MEDIA.dockerManifest : MEDIA.ociManifest;
  const manifest: ImageManifest = {
    schemaVersion: 2,
    mediaType,
    config: { mediaType: docker ? MEDIA.dockerConfig : MEDIA.ociConfig, digest: config.digest, size: config.size },
    layers: [...base.layers.map((l) => ({ mediaType: l.mediaType, digest: l.digest, size: l.size })), { mediaType: docker ? MEDIA.dockerLayerGzip : MEDIA.ociLayerGzip, digest: layer.digest, size: layer.size }],
  };
  return { mediaType, body: Buffer.from(canonical(manifest)) };
}

export function sha256Digest(b: Buffer): string {
  return `sha256:${createHash('sha256').update(b).digest('hex')}`;
}

/** What {@link pushImage} needs. */
export interface PushRequest {
  client: RegistryClient;
  /** The base image's registry when it is another one than `client`'s: its layers are copied through this process. */
  baseClient?: RegistryClient;
  baseRepository: string;
  base: { mediaType: string; manifest: ImageManifest; config: ImageConfig };
  repository: string;
  tag: string;
  layer: LayerBlob;
  labels: BuildLabels;
}

/**
 * Pushes the image: the base's layers (mounted from the base's repository on the same registry, or
 * copied), the new layer, the config, then the manifest under `tag`. Returns the manifest digest.
 */
export async function pushImage(p: PushRequest): Promise<string> {
  for (const l of p.base.manifest.layers) {
    if (!p.baseClient || p.baseClient === p.client) await p.client.copyBlob(p.baseRepository, p.repository, l as Descriptor);
    else if (!(await p.client.hasBlob(p.repository, l.digest))) await p.client.uploadBlob(p.repository, l.digest, await p.baseClient.getBlob(p.baseRepository, l.digest));
  }
  await p.client.uploadBlob(p.repository, p.layer.digest, { file: p.layer.file });
  const config = composeConfig(p.base.config, p.layer, p.labels);
  const configDigest = sha256Digest(config);
  await p.client.uploadBlob(p.repository, configDigest, config);
  const m = composeManifest(p.base.mediaType, p.base.manifest, { digest: configDigest, size: config.length }, p.layer);
  return p.client.putManifest(p.repository, p.tag, m.mediaType, m.body);
}
