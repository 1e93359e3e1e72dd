/**
 * The typed Kubernetes calls the service makes, with the API's answers turned into what callers
 * need: 409 on create is "exists", 404 on get/delete is "absent", other 4xx are unretryable.
 *
 * Every call is plain: no breaker, no retry. The service applies its breaker + retry policy in one
 * place, around a whole run attempt (executions/); background loops (informers, the controller's
 * work queue) retry with their own backoff. A failed call here simply rejects.
 */
import {
  ApiException,
  BatchV1Api,
  CoreV1Api,
  CustomObjectsApi,
  NodeV1Api,
  type KubeConfig,
  type V1Job,
  type V1Pod,
  type V1Secret,
} from '@kubernetes/client-node';
import type { Writable } from 'node:stream';
import { UnretryableError } from '../errors.ts';
import { execInContainer, ExecError, type ExecResult } from './exec.ts';
import type { ListResult } from './informer.ts';

/** HTTP status of an API error, if it carries one. */
export function httpStatusOf(err: unknown): number | undefined {
  if (err instanceof ApiException) return err.code;
  const e = err as { code?: unknown; statusCode?: unknown; httpStatus?: unknown } | null;
  if (typeof e?.httpStatus === 'number') return e.httpStatus;
  if (typeof e?.statusCode === 'number') return e.statusCode;
  if (typeof e?.code === 'number') return e.code;
  return undefined;
}

function messageOf(err: unknown): string {
  if (err instanceof ApiException) {
    const body = err.body as unknown;
    let parsed: { message?: string } | undefined;
    if (typeof body === 'string') {
      try {
        parsed = JSON.parse(body) as { message?: string };
      } catch {
        parsed = { message: body };
      }
    } else parsed = body as { message?: string } | undefined;
    return `HTTP ${err.code}: ${parsed?.message ?? 'no message'}`;
  }
  return err instanceof Error ? err.message : String(err);
}

/** Rethrows a client error as retryable or not: 4xx other than 408/429 will not get better. */
function rethrow(op: string, err: unknown): never {
  const code = httpStatusOf(err);
  if (code !== undefined && code >= 400 && code < 500 && code !== 408 && code !== 429) {
    throw new UnretryableError(`${op}: ${messageOf(err)}`, 'internal_error');
  }
  throw new Error(`${op}: ${messageOf(err)}`, { cause: err });
}

/** The calls the service makes; one instance per client configuration. */
export class KubeApi {
  readonly batch: BatchV1Api;
  readonly core: CoreV1Api;
  readonly node: NodeV1Api;
  readonly custom: CustomObjectsApi;

  constructor(readonly kc: KubeConfig) {
    this.batch = kc.makeApiClient(BatchV1Api);
    this.core = kc.makeApiClient(CoreV1Api);
    this.node = kc.makeApiClient(NodeV1Api);
    this.custom = kc.makeApiClient(CustomObjectsApi);
  }

  private async call<T>(op: string, fn: () => Promise<T>, absent?: { status: number; value: T }): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      if (absent && httpStatusOf(err) === absent.status) return absent.value;
      rethrow(op, err);
    }
  }

  /** Creates a Job; `null` when one of that name exists already (409). */
  createJob(job: V1Job): Promise<V1Job | null> {
    const namespace = job.metadata?.namespace ?? '';
    return this.call('create job', () => this.batch.createNamespacedJob({ namespace, body: job }), { status: 409, value: null });
  }

  /** Reads a Job; `null` when absent. */
  getJob(namespace: string, name: string): Promise<V1Job | null> {
    return this.call('get job', () => this.batch.readNamespacedJob({ namespace, name }), { status: 404, value: null });
  }

  /** Deletes a Job and, in the background, its pods and owned Secret. Absent is fine. */
  async deleteJob(namespace: string, name: string): Promise<void> {
    await this.call(
      'delete job',
      async () => {
        // batch/v1 Jobs default to orphaning their pods: say Background explicitly.
        await this.batch.deleteNamespacedJob({ namespace, name, propagationPolicy: 'Background', gracePeriodSeconds: 0 });
        return true;
      },
      { status: 404, value: false },
    );
  }

  /** Creates a Secret; `false` when one of that name exists already (409). */
  createSecret(secret: V1Secret): Promise<boolean> {
    const namespace = secret.metadata?.namespace ?? '';
    return this.call(
      'create secret',
      async () => {
        await this.core.createNamespacedSecret({ namespace, body: secret });
        return true;
      },
      { status: 409, value: false },
    );
  }

  /** Reads a Secret; `null` when absent. */
  getSecret(namespace: string, name: string): Promise<V1Secret | null> {
    return this.call('get secret', () => this.core.readNamespacedSecret({ namespace, name }), { status: 404, value: null });
  }

  /** Deletes a Secret. Absent is fine. */
  async deleteSecret(namespace: string, name: string): Promise<void> {
    await this.call(
      'delete secret',
      async () => {
        await this.core.deleteNamespacedSecret({ namespace, name });
        return true;
      },
      { status: 404, value: false },
    );
  }

  /** Lists Jobs matching a selector. */
  async listJobs(namespace: string, labelSelector: string, limit?: number): Promise<ListResult<V1Job>> {
    const res = await this.call('list jobs', () => this.batch.listNamespacedJob({ namespace, labelSelector, ...(limit ? { limit } : {}) }));
    return { items: res.items, resourceVersion: res.metadata?.resourceVersion ?? '' };
  }

  /** Lists Pods matching a selector. */
  async listPods(namespace: string, labelSelector: string): Promise<ListResult<V1Pod>> {
    const res = await this.call('list pods', () => this.core.listNamespacedPod({ namespace, labelSelector }));
    return { items: res.items, resourceVersion: res.metadata?.resourceVersion ?? '' };
  }

  /** Last lines of a container's log; empty when it cannot be read. */
  async podLogTail(namespace: string, name: string, container: string, tailLines = 40): Promise<string> {
    try {
      return await this.call('read pod log', () =>
        this.core.readNamespacedPodLog({ namespace, name, container, tailLines, limitBytes: 16 * 1024 }),
      );
    } catch {
      return '';
    }
  }

  /** Whether a RuntimeClass exists. */
  runtimeClassExists(name: string): Promise<boolean> {
    return this.call(
      'get runtimeclass',
      async () => {
        await this.node.readRuntimeClass({ name });
        return true;
      },
      { status: 404, value: false },
    );
  }

  /** Lists custom objects (JobTypes). */
  async listCustom<T>(group: string, version: string, namespace: string, plural: string): Promise<ListResult<T>> {
    const res = (await this.call('list ' + plural, () =>
      this.custom.listNamespacedCustomObject({ group, version, namespace, plural }),
    )) as { items?: T[]; metadata?: { resourceVersion?: string } };
    return { items: res.items ?? [], resourceVersion: res.metadata?.resourceVersion ?? '' };
  }

  /** Runs a command in a container; a refused upgrade (4xx) is unretryable like any other 4xx. */
  exec(
    namespace: string,
    pod: string,
    container: string,
    command: readonly string[],
    opts: { stdout?: Writable; signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<ExecResult> {
    return execInContainer(this.kc, { namespace, pod, container, command, ...opts }).catch((err: unknown) => {
      if (err instanceof ExecError && err.httpStatus !== undefined) rethrow('exec', err);
      throw err;
    });
  }
}
