/**
 * A small client of the OCI distribution API (registry v2), just what a job-type build needs: read
 * an image's manifest (resolving an index to one platform) and config, check, mount, copy and upload
 * blobs, and put a manifest. Authentication: HTTP Basic, or the token flow a `Bearer` challenge asks
 * for (the realm is asked for a token with the Basic credentials), with credentials from a
 * `kubernetes.io/dockerconfigjson` Secret ({@link credentialsFromDockerConfig}).
 *
 * Our own client rather than an npm package: the maintained registry clients on npm only pull
 * (`@snyk/docker-registry-v2-client`), and the ones that push are unmaintained for years
 * (`docker-registry-client`) or barely used (`oci-registry-client` 0.2). What is needed here is five
 * endpoints over `node:http(s)`, with streaming uploads and no dependency.
 */
import { createHash } from 'node:crypto';
import { createReadStream, statSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { Readable } from 'node:stream';

/** Media types of manifests and configs we read and write. */
export const MEDIA = {
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  ociConfig: 'application/vnd.oci.image.config.v1+json',
  ociLayerGzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  dockerConfig: 'application/vnd.docker.container.image.v1+json',
  dockerLayerGzip: 'application/vnd.docker.image.rootfs.diff.tar.gzip',
} as const;

const ACCEPT = [MEDIA.ociManifest, MEDIA.ociIndex, MEDIA.dockerManifest, MEDIA.dockerList].join(', ');

/** A content descriptor. */
export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: { os?: string; architecture?: string; variant?: string };
  annotations?: Record<string, string>;
}

/** An image manifest (OCI or Docker schema 2; same shape). */
export interface ImageManifest {
  schemaVersion: 2;
  mediaType?: string;
  config: Descriptor;
  layers: Descriptor[];
  annotations?: Record<string, string>;
}

/** A parsed image reference. */
export interface ImageReference {
  /** `host[:port]`; `docker.io` references go to `registry-1.docker.io`. */
  registry: string;
  repository: string;
  tag: string | null;
  digest: string | null;
}

const DIGEST_RE = /^sha256:[a-f0-9]{64}$/;

/**
 * Parses `host[:port]/repo[:tag][@sha256:…]` the way container runtimes do: a first component
 * without `.` or `:` (and not `localhost`) means Docker Hub.
 */
export function parseImageReference(ref: string): ImageReference {
  let rest = ref.trim();
  let digest: string | null = null;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST_RE.test(digest)) throw new Error(`image reference ${ref}: not a sha256 digest: ${digest}`);
  }
  let tag: string | null = null;
  const slash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > slash) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
  }
  const first = rest.split('/')[0]!;
  let registry: string;
  let repository: string;
  if (rest.includes('/') && (first.includes('.') || first.includes(':') || first === 'localhost')) {
    registry = first;
    repository = rest.slice(first.length + 1);
  } else {
    registry = 'docker.io';
    repository = rest.includes('/') ? rest : `library/${rest}`;
  }
  if (!/^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/.test(repository)) {
    throw new Error(`image reference ${ref}: invalid repository name ${repository}`);
  }
  if (tag !== null && !/^[\w][\w.-]{0,127}$/.test(tag)) throw new Error(`image reference ${ref}: invalid tag ${tag}`);
  if (tag === null && digest === null) tag = 'latest';
  return { registry, repository, tag, digest };
}

/** Username and password for one registry host. */
export interface RegistryCredentials {
  username: string;
  password: string;
}

/**
 * The credentials for `registry` in a dockerconfigjson document (`{"auths": {host: {auth |
 * username+password}}}`); keys may be bare hosts or URLs. Null when there are none.
 */
export function credentialsFromDockerConfig(json: string, registry: string): RegistryCredentials | null {
  let doc: { auths?: Record<string, { auth?: string; username?: string; password?: string }> };
  try {
    doc = JSON.parse(json) as typeof doc;
  } catch {
    throw new Error('registry secret: .dockerconfigjson is not JSON');
  }
  const hostOf = (key: string) => key.replace(/^https?:\/\//, '').replace(/\/.*$/, '');
  const wanted = registry === 'docker.io' ? ['docker.io', 'index.docker.io', 'registry-1.docker.io'] : [registry];
  for (const [key, entry] of Object.entries(doc.auths ?? {})) {
    if (!wanted.includes(hostOf(key))) continue;
    if (entry.username !== undefined && entry.password !== undefined) return { username: entry.username, password: entry.password };
    if (entry.auth) {
      const text = Buffer.from(entry.auth, 'base64').toString('utf8');
      const i = text.indexOf(':');
      if (i > 0) return { username: text.slice(0, i), password: text.slice(i + 1) };
    }
  }
  return null;
}

/** A registry answered something other than what the protocol says. */
export class RegistryError extends Error {
  override readonly name = 'RegistryError';
  constructor(
    message: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

interface Response {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** Options of {@link RegistryClient}. */
export interface RegistryClientOptions {
  /** Plain HTTP (a test or in-cluster registry without TLS). */
  insecure?: boolean;
  credentials?: RegistryCredentials | null;
  /** Per-request time limit, ms. */
  timeoutMs?: number;
}

/** Parses a `WWW-Authenticate` challenge: scheme and its parameters. */
export function parseChallenge(header: string): { scheme: string; params: Record<string, string> } {
  const m = /^\s*(\w+)\s*(.*)$/.exec(header);
  if (!m) return { scheme: '', params: {} };
  const params: Record<string, string> = {};
  const re = /(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]+))/g;
  for (let p = re.exec(m[2]!); p; p = re.exec(m[2]!)) params[p[1]!.toLowerCase()] = p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : p[3]!;
  return { scheme: m[1]!.toLowerCase(), params };
}

/** One registry host. Tokens are cached per scope. */
export class RegistryClient {
  private readonly base: string;
  private readonly tokens = new Map<string, string>();
  private basicAllowed = false;

  constructor(
    readonly registry: string,
    private readonly opts: RegistryClientOptions = {},
  ) {
    const host = registry === 'docker.io' ? 'registry-1.docker.io' : registry;
    this.base = `${opts.insecure ? 'http' : 'https'}://${host}`;
  }

  /** The manifest of `ref` (a tag or digest) with its digest and media type. */
  async getManifest(repository: string, ref: string): Promise<{ digest: string; mediaType: string; body: Buffer }> {
    const res = await this.request('GET', repository, `/v2/${repository}/manifests/${ref}`, { headers: { accept: ACCEPT } }, 'pull');
    if (res.status !== 200) throw await this.fail(`reading manifest ${repository}:${ref}`, res);
    const digest = `sha256:${createHash('sha256').update(res.body).digest('hex')}`;
    if (DIGEST_RE.test(ref) && ref !== digest) throw new RegistryError(`manifest ${repository}@${ref} has digest ${digest}`);
    const mediaType = String(res.headers['content-type'] ?? '').split(';')[0]!.trim() || ((JSON.parse(res.body.toString('utf8')) as { mediaType?: string }).mediaType ?? '');
    return { digest, mediaType, body: res.body };
  }

  /**
   * The image manifest of `ref` for one platform: an index (manifest list) is resolved to its entry
   * for `platform` (`os/arch`).
   */
  async getImage(repository: string, ref: string, platform: string): Promise<{ digest: string; mediaType: string; manifest: ImageManifest }> {
    let m = await this.getManifest(repository, ref);
    if (m.mediaType === MEDIA.ociIndex || m.mediaType === MEDIA.dockerList) {
      const [os, arch] = platform.split('/');
      const index = JSON.parse(m.body.toString('utf8')) as { manifests?: Descriptor[] };
      const entry = (index.manifests ?? []).find((d) => d.platform?.os === os && d.platform?.architecture === arch);
      if (!entry) throw new RegistryError(`image ${repository}:${ref} has no manifest for ${platform}`);
      m = await this.getManifest(repository, entry.digest);
    }
    const manifest = JSON.parse(m.body.toString('utf8')) as ImageManifest;
    if (!manifest.config || !Array.isArray(manifest.layers)) throw new RegistryError(`manifest ${repository}@${m.digest} is not an image manifest (${m.mediaType})`);
    return { digest: m.digest, mediaType: m.mediaType || manifest.mediaType || MEDIA.ociManifest, manifest };
  }

  /** A (small) blob's bytes, checked against its digest. */
  async getBlob(repository: string, digest: string): Promise<Buffer> {
    const res = await this.request('GET', repository, `/v2/${repository}/blobs/${digest}`, {}, 'pull');
    if (res.status !== 200) throw await this.fail(`reading blob ${digest}`, res);
    const got = `sha256:${createHash('sha256').update(res.body).digest('hex')}`;
    if (got !== digest) throw new RegistryError(`blob ${digest} of ${repository} has digest ${got}`);
    return res.body;
  }

  /** Whether a blob is in a repository. */
  async hasBlob(repository: string, digest: string): Promise<boolean> {
    const res = await this.request('HEAD', repository, `/v2/${repository}/blobs/${digest}`, {}, 'pull');
    if (res.status === 200) return true;
    if (res.status === 404) return false;
    throw await this.fail(`checking blob ${digest}`, res);
  }

  /**
   * Makes a blob of repository `from` (same registry) present in `repository`: a cross-repository
   * mount when the registry does it, otherwise a copy through this process.
   */
  async copyBlob(from: string, repository: string, desc: Descriptor): Promise<void> {
    if (await this.hasBlob(repository, desc.digest)) return;
    if (from !== repository) {
      const q = new URLSearchParams({ mount: desc.digest, from });
      const res = await this.request('POST', repository, `/v2/${repository}/blobs/uploads/?${q}`, { headers: { 'content-length': '0' } }, 'push', from);
      if (res.status === 201) return;
      if (res.status !== 202) throw await this.fail(`mounting blob ${desc.digest} from ${from}`, res);
      // 202: the registry started an ordinary upload instead; it is not used.
    }
    const data = await this.getBlob(from, desc.digest);
    await this.uploadBlob(repository, desc.digest, data);
  }

  /** Uploads a blob (a buffer or a file) with a monolithic PUT, unless it is there already. */
  async uploadBlob(repository: string, digest: string, data: Buffer | { file: string }): Promise<void> {
    if (await this.hasBlob(repository, digest)) return;
    const start = await this.request('POST', repository, `/v2/${repository}/blobs/uploads/`, { headers: { 'content-length': '0' } }, 'push');
    if (start.status !== 202) throw await this.fail('starting a blob upload', start);
    const location = String(start.headers.location ?? '');
    if (!location) throw new RegistryError('the registry started an upload without a Location');
    const url = new URL(location, this.base);
    url.searchParams.set('digest', digest);
    const size = Buffer.isBuffer(data) ? data.length : statSync(data.file).size;
    const body = Buffer.isBuffer(data) ? data : () => createReadStream(data.file);
    const res = await this.request('PUT', repository, url.pathname + url.search, { headers: { 'content-type': 'application/octet-stream', 'content-length': String(size) }, body }, 'push');
    if (res.status !== 201) throw await this.fail(`uploading blob ${digest}`, res);
  }

  /** Puts a manifest under `ref` (a tag or its digest); returns the digest the registry names. */
  async putManifest(repository: string, ref: string, mediaType: string, body: Buffer): Promise<string> {
    const res = await this.request('PUT', repository, `/v2/${repository}/manifests/${ref}`, { headers: { 'content-type': mediaType, 'content-length': String(body.length) }, body }, 'push');
    if (res.status !== 201) throw await this.fail(`putting manifest ${repository}:${ref}`, res);
    const digest = `sha256:${createHash('sha256').update(body).digest('hex')}`;
    const said = res.headers['docker-content-digest'];
    if (said && said !== digest) throw new RegistryError(`the registry stored manifest ${digest} as ${String(said)}`);
    return digest;
  }

  private async fail(what: string, res: Response): Promise<RegistryError> {
    let detail = res.body.toString('utf8').slice(0, 500);
    try {
      const errs = (JSON.parse(detail) as { errors?: { code?: string; message?: string }[] }).errors;
      if (errs?.length) detail = errs.map((e) => `${e.code ?? ''}: ${e.message ?? ''}`).join('; ');
    } catch {
      // not JSON: keep the text
    }
    return new RegistryError(`${what} at ${this.registry}: HTTP ${res.status}${detail ? ` (${detail})` : ''}`, res.status);
  }

  /**
   * One request with authentication: sent as is (or with a cached token); on 401 the challenge is
   * answered once (Basic credentials, or a Bearer token for the scope) and the request sent again.
   */
  private async request(
    method: string,
    repository: string,
    pathAndQuery: string,
    o: { headers?: Record<string, string>; body?: Buffer | (() => Readable) },
    action: 'pull' | 'push',
    mountFrom?: string,
  ): Promise<Response> {
    const scopes = [`repository:${repository}:${action === 'push' ? 'pull,push' : 'pull'}`, ...(mountFrom ? [`repository:${mountFrom}:pull`] : [])];
    const key = scopes.join(' ');
    const send = (auth: string | null) => this.send(method, pathAndQuery, { ...(o.headers ?? {}), ...(auth ? { authorization: auth } : {}) }, o.body);
    const cached = this.tokens.get(key);
    let res = await send(cached ? `Bearer ${cached}` : this.basicAllowed ? this.basic() : null);
    if (res.status !== 401) return res;
    const challenge = parseChallenge(String(res.headers['www-authenticate'] ?? ''));
    if (challenge.scheme === 'basic') {
      if (!this.opts.credentials) throw new RegistryError(`${this.registry} asks for credentials and none are configured (kubernetes.build_registry_secret)`, 401);
      this.basicAllowed = true;
      res = await send(this.basic());
    } else if (challenge.scheme === 'bearer') {
      const token = await this.token(challenge.params, scopes);
      this.tokens.set(key, token);
      res = await send(`Bearer ${token}`);
    }
    if (res.status === 401) throw new RegistryError(`${this.registry} refused the credentials for ${key}`, 401);
    return res;
  }

  private basic(): string | null {
    const c = this.opts.credentials;
    return c ? `Basic ${Buffer.from(`${c.username}:${c.password}`).toString('base64')}` : null;
  }

  /** The token service's answer for `scopes` (distribution's token authentication). */
  private async token(params: Record<string, string>, scopes: string[]): Promise<string> {
    const realm = params.realm;
    if (!realm) throw new RegistryError(`${this.registry} sent a Bearer challenge without a realm`);
    const url = new URL(realm);
    if (params.service) url.searchParams.set('service', params.service);
    for (const s of scopes) url.searchParams.append('scope', s);
    const res = await this.send('GET', url.toString(), this.basic() ? { authorization: this.basic()! } : {}, undefined);
    if (res.status !== 200) throw new RegistryError(`token service ${url.origin} answered HTTP ${res.status}`, res.status);
    const doc = JSON.parse(res.body.toString('utf8')) as { token?: string; access_token?: string };
    const token = doc.token ?? doc.access_token;
    if (!token) throw new RegistryError(`token service ${url.origin} returned no token`);
    return token;
  }

  private send(method: string, target: string, headers: Record<string, string>, body: Buffer | (() => Readable) | undefined): Promise<Response> {
    const url = new URL(target, this.base);
    const lib = url.protocol === 'https:' ? https : http;
    return new Promise<Response>((resolve, reject) => {
      const req = lib.request(url, { method, headers, timeout: this.opts.timeoutMs ?? 300_000 }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => {
          if (method !== 'HEAD') chunks.push(c);
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      });
      req.on('timeout', () => req.destroy(new RegistryError(`${method} ${url.origin}${url.pathname}: no answer in time`)));
      req.on('error', (err) => reject(err instanceof RegistryError ? err : new RegistryError(`${method} ${url.origin}${url.pathname}: ${err.message}`)));
      if (body === undefined) req.end();
      else if (Buffer.isBuffer(body)) req.end(body);
      else {
        const stream = body();
        stream.on('error', (err) => req.destroy(err));
        stream.pipe(req);
      }
    });
  }
}
