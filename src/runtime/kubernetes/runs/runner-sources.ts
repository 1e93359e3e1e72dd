/**
 * The runner and the collectors' scripts (deliver.py for attach pods, session-collector.py for
 * session pods) as every run and session pod gets them: from one immutable ConfigMap per version of
 * the texts, in the runs namespace, mounted read-only at `/sandpod` in both containers (a `secret`
 * cold run's pod mounts it as well: its Secret then holds only the run's own bytes). Inline in the
 * commands (`python3 -c <text>`) or in a run's Secret, the ≈ 85 KB of the texts made every such
 * object that large: each create, each claim's patch, each watch event of the Job and its pod, each
 * status update the kubelet writes carried them through the API server and etcd (a claim's patch
 * took 19 ms against 12 ms for a small Job on kcluster; a cold attach run's pod was created ≈ 35 ms
 * sooner after the POST with the ConfigMap). With it such a Job is a few KB.
 *
 * The ConfigMap's name is a hash of the texts, so a service of another version (a rolling upgrade)
 * uses its own, and the pool's spec hash changes with it. Whoever creates a pod that mounts it makes
 * sure it exists first ({@link RunnerSources.ensure}: a create, 409 is fine, repeated at most once a
 * minute so a deleted one comes back). The leader removes those of its instance that no Job names
 * and that are older than {@link SOURCES_MIN_AGE_MS} ({@link staleSources}, pure).
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { V1ConfigMap, V1Job } from '@kubernetes/client-node';
import type { Clock } from '../../../clock.ts';
import type { KubeApi } from '../../../kube/index.ts';
import type { Logger } from '../../../logger.ts';
import { DELIVER_PATH, RUNNER_PATH, SESSION_COLLECTOR_PATH } from '../../../sandbox/paths.ts';
import { LABELS, MANAGED_BY } from '../names.ts';
import { toMs } from './decide.ts';

/** Where pods mount the texts. */
export const SOURCES_DIR = '/sandpod';
/** The ConfigMap's keys, which are the files' names under {@link SOURCES_DIR}. */
export const SOURCE_FILES = { runner: 'runner.py', deliver: 'deliver.py', session: 'session-collector.py' } as const;
/** The texts the ConfigMap holds, by {@link SOURCE_FILES} key. */
export type SourceTexts = Record<keyof typeof SOURCE_FILES, string>;

/** The texts as this checkout ships them (src/sandbox, or dist/sandbox once built). */
export function shippedSources(): SourceTexts {
  return { runner: readFileSync(RUNNER_PATH, 'utf8'), deliver: readFileSync(DELIVER_PATH, 'utf8'), session: readFileSync(SESSION_COLLECTOR_PATH, 'utf8') };
}

/** What a builder of pods that mount the ConfigMap needs of {@link RunnerSources}. */
export interface SourcesRef {
  /** The ConfigMap's name. */
  name(): string;
  /** Makes sure it exists; called before a Job whose pod mounts it is created. */
  ensure(): Promise<void>;
}
/** The label that marks a sources ConfigMap. */
export const SOURCES_LABEL = 'sandpod.io/runner-sources';
/** How long an unused sources ConfigMap is kept (a pod of another version may be about to mount it). */
export const SOURCES_MIN_AGE_MS = 10 * 60_000;
/** How often {@link RunnerSources.ensure} creates the ConfigMap again, ms. */
const ENSURE_EVERY_MS = 60_000;

/** The ConfigMap's name for these texts. Pure. */
export function sourcesName(texts: SourceTexts): string {
  const h = createHash('sha256');
  for (const key of Object.keys(SOURCE_FILES).sort() as (keyof SourceTexts)[]) h.update(key).update('\0').update(texts[key]).update('\0');
  const hex = h.digest('hex').slice(0, 16);
  return `sandpod-runner-${hex}`;
}

/** The ConfigMap itself. Pure. */
export function sourcesConfigMap(namespace: string, instance: string, texts: SourceTexts): V1ConfigMap {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: sourcesName(texts), namespace, labels: { [LABELS.managedBy]: MANAGED_BY, [LABELS.instance]: instance, [SOURCES_LABEL]: 'true' } },
    immutable: true,
    data: { [SOURCE_FILES.runner]: texts.runner, [SOURCE_FILES.deliver]: texts.deliver, [SOURCE_FILES.session]: texts.session },
  };
}

/** The volume attach pods mount the texts from (`defaultMode` read-only for everyone). */
export function sourcesVolume(name: string): { name: string; configMap: { name: string; defaultMode: number } } {
  return { name: 'runner', configMap: { name, defaultMode: 0o444 } };
}

/** Its mount, read-only at {@link SOURCES_DIR}, for a container that runs one of the texts. */
export function sourcesMount(): { name: string; mountPath: string; readOnly: true } {
  return { name: 'runner', mountPath: SOURCES_DIR, readOnly: true };
}

/** ConfigMap names the Jobs' pod templates mount. */
function mountedBy(jobs: readonly V1Job[]): Set<string> {
  const names = new Set<string>();
  for (const j of jobs) for (const v of j.spec?.template.spec?.volumes ?? []) if (v.configMap?.name) names.add(v.configMap.name);
  return names;
}

/**
 * The sources ConfigMaps to delete: not the current one, named by no Job, older than `minAgeMs`. Pure.
 */
export function staleSources(configMaps: readonly V1ConfigMap[], jobs: readonly V1Job[], current: string, now: number, minAgeMs = SOURCES_MIN_AGE_MS): string[] {
  const used = mountedBy(jobs);
  return configMaps
    .filter((cm) => {
      const name = cm.metadata?.name ?? '';
      const created = toMs(cm.metadata?.creationTimestamp) ?? now;
      return name !== '' && name !== current && !used.has(name) && now - created >= minAgeMs;
    })
    .map((cm) => cm.metadata!.name!);
}

/** Options of {@link RunnerSources}. */
export interface RunnerSourcesOptions {
  api: KubeApi;
  namespace: string;
  instance: string;
  clock: Clock;
  log: Logger;
  /** The texts; default: read from `src/sandbox` once, when first needed. */
  runner?: string;
  deliver?: string;
  session?: string;
}

/** The texts, their ConfigMap's name, and the API calls that keep it there (see the module comment). */
export class RunnerSources implements SourcesRef {
  /** The shipped texts, read once when one the options did not give is first needed. */
  private shipped: SourceTexts | null = null;
  private ensuredAt: number | null = null;
  private ensuring: Promise<void> | null = null;
  private nameOf: string | null = null;

  constructor(private readonly o: RunnerSourcesOptions) {}

  private text(key: keyof SourceTexts): string {
    return this.o[key] ?? (this.shipped ??= shippedSources())[key];
  }

  runner(): string {
    return this.text('runner');
  }

  private texts(): SourceTexts {
    return { runner: this.text('runner'), deliver: this.text('deliver'), session: this.text('session') };
  }

  /** The ConfigMap's name. */
  name(): string {
    return (this.nameOf ??= sourcesName(this.texts()));
  }

  /** Makes sure the ConfigMap exists before a pod that mounts it is made (at most one create a minute). */
  async ensure(): Promise<void> {
    const now = this.o.clock.now();
    if (this.ensuredAt !== null && now - this.ensuredAt < ENSURE_EVERY_MS) return;
    this.ensuring ??= (async () => {
      try {
        const made = await this.o.api.createConfigMap(sourcesConfigMap(this.o.namespace, this.o.instance, this.texts()));
        if (made) this.o.log.info({ configmap: this.name() }, 'created the runner sources ConfigMap');
        this.ensuredAt = this.o.clock.now();
      } finally {
        this.ensuring = null;
      }
    })();
    await this.ensuring;
  }

  /** The leader's part: removes this instance's sources ConfigMaps no Job names any more. */
  async collectGarbage(jobs: readonly V1Job[]): Promise<void> {
    const selector = `${LABELS.instance}=${this.o.instance},${SOURCES_LABEL}=true`;
    const stale = staleSources(await this.o.api.listConfigMaps(this.o.namespace, selector), jobs, this.name(), this.o.clock.now());
    for (const name of stale) {
      this.o.log.info({ configmap: name }, 'removing an unused runner sources ConfigMap');
      await this.o.api.deleteConfigMap(this.o.namespace, name);
    }
  }
}
