/**
 * Job-type builds on the Kubernetes runtime (SPEC §4.9, issue #11): no Docker, no privileged builder.
 *
 * 1. The executor image is resolved in its registry to a manifest digest (one platform of an index):
 *    the base of the build, and part of its digest.
 * 2. A build Job ({@link buildEnvJob}) in the runs namespace installs the requirements with pip into
 *    `/build/site` of an emptyDir, with the run pods' restricted security context.
 * 3. The service streams `/build` out of the pod's `hold` container (exec + tar, as a run's
 *    `/output`), checks every entry ({@link collectTree}) and reads the lock from pip's `--report`.
 * 4. The directory, with `requirements.lock` and `build.json`, becomes one reproducible layer under
 *    `/sandpod-env` ({@link writeLayer}), pushed with a new config (PYTHONPATH) and manifest on top of
 *    the executor image to `<build_registry>/<job type>` through the OCI distribution API, tagged
 *    with the environment digest; the image is named by its manifest digest.
 *
 * The service pushes, not the pod: the registry credentials (a dockerconfigjson Secret in the
 * service's namespace) never reach the runs namespace, where the packages' own install code runs.
 *
 * The environment digest is the sha256 of the canonical JSON of the Python version, the base image's
 * manifest digest and platform, the runner's sha256 and the lock (every distribution, version and
 * archive sha256). Runs of a built type use `imageRef` (by digest) and install nothing.
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import type { V1Job, V1Pod } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { BuiltEnvironment, JobType, LockedRequirement } from '../../../jobtypes/job-type.ts';
import type { BuildStatusUpdate } from '../../../jobtypes/kubernetes-registry.ts';
import type { KubeApi } from '../../../kube/index.ts';
import { silentLogger, type Logger } from '../../../logger.ts';
import { canonical, sha256 } from '../../../util/json.ts';
import { lockFileText, lockFromReport } from '../../local/builds/build.ts';
import { invalidRequirement, normalizeRequirements } from '../../local/builds/deps.ts';
import { BuildFailedError, type Builder, type BuildRequest } from '../../runtime.ts';
import { BUILD_COLLECT_COMMAND, BUILD_CONTAINERS, BUILD_RELEASE_COMMAND, buildEnvJob, buildJobName, pipOptions } from './build-env-job.ts';
import { ENV_ROOT, pushImage, type ImageConfig } from './build-image.ts';
import { collectTree, readTreeFile, writeLayer, type TreeEntry } from './build-layer.ts';
import { RegistryClient, credentialsFromDockerConfig, parseImageReference, type ImageManifest, type RegistryCredentials } from './build-registry.ts';
import { executorImage } from '../runs/build-job.ts';

/** Format label inside every digest and input key. */
const FORMAT = 'sandpod-kubernetes-build/1';

/** What the runtime lends its builder. */
export interface KubernetesBuilderDeps {
  config: Config;
  api: KubeApi;
  /** The pods and Jobs of this instance, from the controller's informers. */
  pods: () => V1Pod[];
  jobs: () => V1Job[];
  /** RuntimeClass of builds (the runs' one): a name, null (none), false (strict mode without it). */
  runtimeClass: () => Promise<string | null | false>;
  runnerSource: () => string;
  clock: Clock;
  logger?: Logger;
  /** Writes a build's state to its JobType's status (when the type is a resource). */
  reportStatus?: (jobType: string, update: BuildStatusUpdate) => Promise<void>;
  /** Where collected trees and layers are written while a build runs. */
  workDir: string;
  /** How often the build pod's state is looked at, ms. */
  pollMs?: number;
  execTimeoutMs?: number;
}

/** What a build pod's state means (pure; table-tested). */
export type BuildPodVerdict = { kind: 'wait'; detail?: string } | { kind: 'collect'; pod: string } | { kind: 'failed'; message: string; pipLog?: string };

const PULL_ERRORS = new Set(['ErrImagePull', 'ImagePullBackOff', 'InvalidImageName', 'ErrImageNeverPull', 'CreateContainerConfigError', 'CreateContainerError']);

/** Reads a build pod (and its Job): wait, collect from it, or give up with the reason. */
export function buildPodVerdict(job: V1Job | undefined, pod: V1Pod | undefined): BuildPodVerdict {
  const failedJob = job?.status?.conditions?.find((c) => c.type === 'Failed' && c.status === 'True');
  const jobFailure = failedJob ? ({ kind: 'failed', message: `the build Job failed: ${failedJob.reason ?? ''} ${failedJob.message ?? ''}`.trim() } as const) : null;
  if (!pod) return jobFailure ?? { kind: 'wait', detail: 'waiting for the build pod' };
  const name = pod.metadata?.name ?? '';
  const pip = pod.status?.initContainerStatuses?.find((c) => c.name === BUILD_CONTAINERS.pip);
  const hold = pod.status?.containerStatuses?.find((c) => c.name === BUILD_CONTAINERS.hold);
  for (const c of [pip, hold]) {
    const w = c?.state?.waiting;
    if (w?.reason && PULL_ERRORS.has(w.reason)) return { kind: 'failed', message: `the build pod cannot start: ${w.reason}${w.message ? `: ${w.message}` : ''}` };
  }
  const t = pip?.state?.terminated;
  // pip's own failure explains a failed Job (BackoffLimitExceeded) best.
  if (t && t.exitCode !== 0) return { kind: 'failed', message: `pip install failed (exit ${t.exitCode})`, pipLog: t.message ?? '' };
  if (jobFailure) return jobFailure;
  if (pod.metadata?.deletionTimestamp) return { kind: 'failed', message: 'the build pod was deleted' };
  if (pod.status?.phase === 'Failed') return { kind: 'failed', message: `the build pod failed: ${pod.status.reason ?? ''} ${pod.status.message ?? ''}`.trim() };
  if (t && t.exitCode === 0 && hold?.state?.running) return { kind: 'collect', pod: name };
  if (hold?.state?.terminated) return { kind: 'failed', message: `the build pod's hold container ended (exit ${hold.state.terminated.exitCode}) before its files were collected` };
  const unschedulable = pod.status?.conditions?.find((c) => c.type === 'PodScheduled' && c.status === 'False');
  if (unschedulable) return { kind: 'wait', detail: `build pod not scheduled: ${unschedulable.message ?? unschedulable.reason ?? ''}` };
  return { kind: 'wait', detail: pip?.state?.running ? 'pip is installing' : 'build pod starting' };
}

/** The environment digest (see the module comment). */
export function kubernetesEnvironmentDigest(p: { pythonVersion: string; baseDigest: string; platform: string; runnerSha256: string; lock: readonly LockedRequirement[] }): string {
  return sha256(canonical({ format: FORMAT, python_version: p.pythonVersion, base: p.baseDigest, platform: p.platform, runner: p.runnerSha256, lock: p.lock }));
}

/** The Kubernetes runtime's {@link Builder}. */
export class KubernetesBuilder implements Builder {
  private readonly log: Logger;
  private readonly registry: { host: string; prefix: string };
  private credentials: { at: number; value: string | null } | null = null;

  constructor(private readonly d: KubernetesBuilderDeps) {
    this.log = d.logger ?? silentLogger;
    const r = d.config.kubernetes.build_registry;
    if (!r) throw new Error('KubernetesBuilder: kubernetes.build_registry is not set');
    const slash = r.indexOf('/');
    this.registry = slash < 0 ? { host: r, prefix: '' } : { host: r.slice(0, slash), prefix: r.slice(slash + 1) };
  }

  /** The repository of a type's images. */
  repositoryOf(jobType: string): string {
    return this.registry.prefix ? `${this.registry.prefix}/${jobType}` : `sandpod/${jobType}`;
  }

  inputKey(jobType: JobType, requirements: readonly string[]): string {
    const c = this.d.config;
    return sha256(
      canonical({
        format: FORMAT,
        python_version: jobType.pythonVersion,
        base: jobType.image ?? executorImage(c),
        platform: c.kubernetes.build_platform,
        registry: c.kubernetes.build_registry,
        pip: c.pip,
        runner: sha256(this.d.runnerSource()),
        requirements: normalizeRequirements(requirements),
      }),
    );
  }

  /** Images live in the registry: nothing to make present on this replica. */
  has(_env: BuiltEnvironment): boolean {
    return true;
  }

  async materialize(): Promise<void> {}

  async build(req: BuildRequest): Promise<BuiltEnvironment> {
    const name = req.jobType.name;
    await this.status(name, { phase: 'building', message: `building ${normalizeRequirements(req.requirements).join(' ') || '(no requirements)'}` });
    try {
      const env = await this.run(req);
      await this.status(name, { phase: 'ready', imageRef: env.imageRef, message: `${env.imageRef} (environment sha256:${env.digest})` });
      return env;
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      await this.status(name, { phase: 'failed', message });
      throw err instanceof BuildFailedError ? err : new BuildFailedError(message);
    }
  }

  private async status(jobType: string, update: BuildStatusUpdate): Promise<void> {
    try {
      await this.d.reportStatus?.(jobType, update);
    } catch (err) {
      this.log.warn({ job_type: jobType, err: String(err) }, 'could not write the JobType status');
    }
  }

  private async run(req: BuildRequest): Promise<BuiltEnvironment> {
    const c = this.d.config;
    const jt = req.jobType;
    const reqs = normalizeRequirements(req.requirements);
    const bad = invalidRequirement(reqs);
    if (bad) throw new BuildFailedError(bad);

    req.onProgress('resolving', 'reading the executor image');
    const creds = await this.credentialsFor();
    const baseRef = parseImageReference(jt.image ?? executorImage(c));
    const target = new RegistryClient(this.registry.host, { insecure: c.kubernetes.build_registry_insecure, credentials: creds(this.registry.host) });
    const baseClient =
      baseRef.registry === this.registry.host ? target : new RegistryClient(baseRef.registry, { insecure: c.kubernetes.build_registry_insecure && baseRef.registry === this.registry.host, credentials: creds(baseRef.registry) });
    const base = await baseClient.getImage(baseRef.repository, baseRef.digest ?? baseRef.tag!, c.kubernetes.build_platform);
    const baseConfig = JSON.parse((await baseClient.getBlob(baseRef.repository, base.manifest.config.digest)).toString('utf8')) as ImageConfig;
    const baseImage = `${baseRef.registry}/${baseRef.repository}@${base.digest}`;

    mkdirSync(this.d.workDir, { recursive: true });
    const work = mkdtempSync(path.join(this.d.workDir, 'build-'));
    try {
      let tree = new Map<string, TreeEntry>();
      let lock: LockedRequirement[] = [];
      if (reqs.length > 0) {
        tree = await this.install(req, reqs, baseImage, path.join(work, 'tree'));
        const report = tree.get('report.json');
        if (!report || report.type !== 'file') throw new BuildFailedError('pip wrote no installation report');
        try {
          lock = lockFromReport(JSON.parse(readTreeFile(report).toString('utf8')));
        } catch (err) {
          throw new BuildFailedError(`pip's installation report is unreadable: ${(err as Error).message}`);
        }
        tree.delete('report.json');
      }
      const runnerSha256 = sha256(this.d.runnerSource());
      const digest = kubernetesEnvironmentDigest({ pythonVersion: jt.pythonVersion, baseDigest: base.digest, platform: c.kubernetes.build_platform, runnerSha256, lock });
      const files: TreeEntry[] = [{ type: 'directory', name: 'site' }, ...[...tree.values()].filter((e) => e.name === 'site' || e.name.startsWith('site/'))];
      const text = (name: string, s: string): TreeEntry => ({ type: 'file', name, size: Buffer.byteLength(s), executable: false, source: { data: Buffer.from(s) } });
      files.push(text('requirements.lock', lockFileText(lock)));
      files.push(
        text(
          'build.json',
          `${JSON.stringify({ format: FORMAT, digest, job_type: jt.name, python_version: jt.pythonVersion, base: baseImage, platform: c.kubernetes.build_platform, runner_sha256: runnerSha256, pip: pipOptions(c.pip), lock }, null, 2)}\n`,
        ),
      );
      req.onProgress('publishing', `pushing to ${this.registry.host}/${this.repositoryOf(jt.name)}`);
      const layer = await writeLayer(files, ENV_ROOT, path.join(work, 'layer.tar.gz'));
      const repository = this.repositoryOf(jt.name);
      const manifestDigest = await pushImage({
        client: target,
        baseClient,
        baseRepository: baseRef.repository,
        base: { mediaType: base.mediaType, manifest: base.manifest as ImageManifest, config: baseConfig },
        repository,
        tag: `sha256-${digest}`,
        layer,
        labels: { jobType: jt.name, envDigest: digest },
      });
      return { digest, imageRef: `${this.registry.host}/${repository}@${manifestDigest}`, pythonVersion: jt.pythonVersion, lock };
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }

  /** Runs the build Job and streams its installed directory into `dir`. */
  private async install(req: BuildRequest, reqs: string[], image: string, dir: string): Promise<Map<string, TreeEntry>> {
    const c = this.d.config;
    const ns = c.kubernetes.runs_namespace;
    const rc = await this.d.runtimeClass();
    if (rc === false) throw new BuildFailedError(`security_mode strict requires RuntimeClass ${c.kubernetes.runtime_class}, which does not exist in the cluster`);
    const buildKey = randomUUID();
    const job = buildEnvJob(
      { jobType: req.jobType.name, buildKey, image, requirements: reqs, runtimeClassName: rc, deadlineSeconds: Math.max(1, (req.deadline - this.d.clock.now()) / 1000) },
      c,
    );
    const jobName = buildJobName(req.jobType.name, buildKey);
    req.onProgress('installing', `pip install ${reqs.join(' ')}`);
    const created = await this.d.api.createJob(job);
    if (!created) throw new BuildFailedError(`build Job ${jobName} exists already`);
    const log = this.log.child({ job_type: req.jobType.name, build_job: jobName });
    try {
      const pod = await this.waitForPod(req, jobName, created.metadata?.uid ?? '');
      const pipe = new PassThrough();
      const collecting = collectTree(pipe, dir);
      collecting.catch(() => undefined);
      const exec = await this.d.api.exec(ns, pod, BUILD_CONTAINERS.hold, BUILD_COLLECT_COMMAND, { stdout: pipe, timeoutMs: this.d.execTimeoutMs ?? 600_000, ...(req.signal ? { signal: req.signal } : {}) });
      if (exec.exitCode !== 0) {
        pipe.destroy();
        throw new BuildFailedError(`streaming the installed files out of the build pod failed (exit ${exec.exitCode ?? '?'}): ${exec.stderr.slice(0, 500)}`);
      }
      const tree = await collecting;
      await this.d.api.exec(ns, pod, BUILD_CONTAINERS.hold, BUILD_RELEASE_COMMAND, { timeoutMs: 30_000 }).catch((err: unknown) => log.warn({ err: String(err) }, 'could not release the build pod'));
      return tree;
    } finally {
      await this.d.api.deleteJob(ns, jobName).catch((err: unknown) => log.warn({ err: String(err) }, 'could not delete the build Job'));
    }
  }

  /** Waits until the build pod's files can be collected; throws with pip's output when it failed. */
  private async waitForPod(req: BuildRequest, jobName: string, jobUid: string): Promise<string> {
    const ns = this.d.config.kubernetes.runs_namespace;
    let lastDetail = '';
    for (;;) {
      if (req.signal?.aborted) throw new BuildFailedError('the build was cancelled');
      if (this.d.clock.now() >= req.deadline) throw new BuildFailedError(`the build did not finish in time${lastDetail ? ` (${lastDetail})` : ''}`);
      const job = this.d.jobs().find((j) => j.metadata?.name === jobName && j.metadata?.uid === jobUid);
      const pod = this.d
        .pods()
        .find((p) => p.metadata?.namespace === ns && (p.metadata?.ownerReferences ?? []).some((r) => r.uid === jobUid));
      const v = buildPodVerdict(job, pod);
      if (v.kind === 'collect') return v.pod;
      if (v.kind === 'failed') {
        let output = v.pipLog ?? '';
        if (pod?.metadata?.name && v.message.startsWith('pip install failed')) {
          output = (await this.d.api.podLogTail(ns, pod.metadata.name, BUILD_CONTAINERS.pip, 60)) || output;
        }
        throw new BuildFailedError(output ? `${v.message}: ${output.trim()}` : v.message);
      }
      if (v.detail && v.detail !== lastDetail) {
        lastDetail = v.detail;
        req.onProgress('installing', v.detail);
      }
      await new Promise((r) => setTimeout(r, this.d.pollMs ?? 250));
    }
  }

  /** Credentials per registry host from the configured dockerconfigjson Secret (cached a minute). */
  private async credentialsFor(): Promise<(host: string) => RegistryCredentials | null> {
    const c = this.d.config.kubernetes;
    if (!c.build_registry_secret) return () => null;
    const now = this.d.clock.now();
    if (!this.credentials || now - this.credentials.at > 60_000) {
      const secret = await this.d.api.getSecret(c.namespace, c.build_registry_secret);
      if (!secret) throw new BuildFailedError(`registry secret ${c.namespace}/${c.build_registry_secret} (kubernetes.build_registry_secret) does not exist`);
      const raw = secret.data?.['.dockerconfigjson'];
      if (!raw) throw new BuildFailedError(`registry secret ${c.namespace}/${c.build_registry_secret} has no .dockerconfigjson (type kubernetes.io/dockerconfigjson)`);
      this.credentials = { at: now, value: Buffer.from(raw, 'base64').toString('utf8') };
    }
    const json = this.credentials.value;
    return (host) => (json ? credentialsFromDockerConfig(json, host) : null);
  }
}
