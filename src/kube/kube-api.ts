/**
 * The typed Kubernetes calls the service makes, with the API's answers turned into what callers
 * need: 409 on create is "exists", 404 on get/delete is "absent", other 4xx are unretryable.
 *
 * Every call has a deadline (`requestTimeoutMs`, default {@link DEFAULT_REQUEST_TIMEOUT_MS}): an API
 * server that accepts a request and never answers (overloaded, wedged behind a load balancer, etcd
 * stuck) fails the call with {@link KubeTimeoutError} instead of holding a run attempt, a reconcile
 * pass or an informer's re-list forever. The same deadline goes to the server as `?timeout=`, so a
 * server that is only slow stops working on a request its client has given up on. The client's own
 * fetch has no default timeout, hence the per-call abort signal.
 *
 * Every call is plain: no breaker, no retry. The service applies its breaker + retry policy in one
 * place, around a whole run attempt (executions/); background loops (informers, the controller's
 * work queue) retry with their own backoff. A failed call here simply rejects.
 */
import {
  Observable,
  type ConfigurationOptions,
  type RequestContext,
  type ResponseContext,
  BatchV1Api,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  NodeV1Api,
  type KubeConfig,
  type V1ConfigMap,
  type V1Job,
  type V1Lease,
  type V1Pod,
  type V1Secret,
} from '@kubernetes/client-node';
import http from 'node:http';
import https from 'node:https';
import type { Writable } from 'node:stream';
import { KubeTimeoutError, httpStatusOf, rethrow } from './api-errors.ts';
import { attachToContainer, type AttachSession } from './attach.ts';
import { CallGate } from './call-gate.ts';
import { sendJson } from './send-json.ts';
import { execInContainer, ExecError, type ExecResult } from './exec.ts';
import type { ListResult } from './informer.ts';

export { KubeTimeoutError, httpStatusOf, isApiUnavailable } from './api-errors.ts';

/** How long one API call may take unless configured otherwise, ms. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;

/**
 * Connections to the API server kept open and shared by every call (see {@link KubeApi.sharedAgent}):
 * also the most calls on the wire at once; more wait in the agent's queue.
 */
export const MAX_API_SOCKETS = 32;

/** How long one exec may take when its caller gives no limit, ms. */
export const DEFAULT_EXEC_TIMEOUT_MS = 60_000;

/** The calls the service makes; one instance per client configuration. */
export class KubeApi {
  readonly batch: BatchV1Api;
  readonly core: CoreV1Api;
  readonly node: NodeV1Api;
  readonly custom: CustomObjectsApi;
  readonly coordination: CoordinationV1Api;

  /** Deadline of one call (and of an exec's handshake), ms. */
  readonly requestTimeoutMs: number;
  private agent: http.Agent | null = null;
  /** Calls at work at once: as many as the agent has sockets (call-gate.ts says why). */
  readonly gate = new CallGate(MAX_API_SOCKETS);

  constructor(
    readonly kc: KubeConfig,
    opts: { requestTimeoutMs?: number } = {},
  ) {
    this.batch = kc.makeApiClient(BatchV1Api);
    this.core = kc.makeApiClient(CoreV1Api);
    this.node = kc.makeApiClient(NodeV1Api);
    this.custom = kc.makeApiClient(CustomObjectsApi);
    this.coordination = kc.makeApiClient(CoordinationV1Api);
    this.requestTimeoutMs = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  }

  /**
   * Runs one generated-client call under the deadline: `fn` gets the per-call options that put the
   * abort signal (and the server-side `timeout`) on its request; the signal covers the body too.
   */
  private async call<T>(op: string, fn: (o: ConfigurationOptions, signal: AbortSignal) => Promise<T>, absent?: { status: number; value: T }, urgent = false): Promise<T> {
    const ms = this.requestTimeoutMs;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), ms);
    let entered = false;
    const options: ConfigurationOptions = {
      middleware: [
        {
          pre: (ctx: RequestContext) => {
            ctx.setSignal(abort.signal);
            const made = ctx.getAgent();
            if (made) ctx.setAgent(this.sharedAgent(made));
            ctx.setQueryParam('timeout', `${Math.max(1, Math.ceil(ms / 1000))}s`);
            return new Observable(Promise.resolve(ctx));
          },
          post: (res: ResponseContext) => new Observable(Promise.resolve(res)),
        },
      ],
      middlewareMergeStrategy: 'append',
    };
    try {
      // The deadline runs from here, as it did when calls waited in the agent's queue instead.
      await this.gate.enter(abort.signal, urgent);
      entered = true;
      return await fn(options, abort.signal);
    } catch (err) {
      if (abort.signal.aborted) throw new KubeTimeoutError(`${op}: no answer from the Kubernetes API within ${ms} ms`, { cause: err });
      if (absent && httpStatusOf(err) === absent.status) return absent.value;
      return rethrow(op, err);
    } finally {
      clearTimeout(timer);
      if (entered) this.gate.leave();
    }
  }

  /**
   * One keep-alive agent for every call, made from the options of the first call's agent (the
   * cluster's CA, client certificate, TLS settings). The generated client makes a new agent for each
   * request, so each call opened (and on a real cluster TLS-handshook) a connection of its own: with
   * a thousand runs starting at once, a thousand connections in one tick. Proxy agents (a cluster
   * with `proxy-url`) are left as they are.
   */
  private sharedAgent(made: http.Agent): http.Agent {
    if (made.constructor !== https.Agent && made.constructor !== http.Agent) return made;
    const agent = this.agentFor((made as http.Agent & { options?: https.AgentOptions }).options ?? {}, made.constructor === https.Agent);
    made.destroy();
    return agent;
  }

  /** The shared agent, made from these TLS options if there is none yet. */
  private agentFor(options: https.AgentOptions | https.RequestOptions, secure: boolean): http.Agent {
    const { headers: _h, auth: _a, ...tls } = options as https.AgentOptions & { headers?: unknown; auth?: unknown };
    // An idle connection is closed after 4 s, before a server's idle timeout (Node's 5 s, the API
    // server's longer) could close it under a request that reuses it.
    this.agent ??= new (secure ? https.Agent : http.Agent)({ ...tls, keepAlive: true, maxSockets: MAX_API_SOCKETS, maxFreeSockets: MAX_API_SOCKETS, timeout: 4_000 });
    return this.agent;
  }

  /** Creates a Job; `null` when one of that name exists already (409). */
  createJob(job: V1Job): Promise<V1Job | null> {
    const namespace = job.metadata?.namespace ?? '';
    return this.call('create job', (o) => this.batch.createNamespacedJob({ namespace, body: job }, o), { status: 409, value: null });
  }

  /**
   * Applies a JSON patch (RFC 6902) to a Job that sets `metadata.resourceVersion` to the version it was
   * read at (the API server's precondition): `null` when another writer changed it since (409
   * Conflict) or it is gone (404).
   */
  async patchJobIfUnchanged(namespace: string, name: string, ops: object[]): Promise<V1Job | null> {
    try {
      return await this.call('patch job', (o) => this.batch.patchNamespacedJob({ namespace, name, body: ops }, o), { status: 409, value: null });
    } catch (err) {
      if (httpStatusOf((err as { cause?: unknown }).cause ?? err) === 404 || /HTTP 404/.test(String(err))) return null;
      throw err;
    }
  }

  /** {@link patchJobIfUnchanged} for a Pod: `null` on 409 (changed since it was read) or 404 (gone). */
  async patchPodIfUnchanged(namespace: string, name: string, ops: object[]): Promise<V1Pod | null> {
    try {
      return await this.call('patch pod', (o) => this.core.patchNamespacedPod({ namespace, name, body: ops }, o), { status: 409, value: null });
    } catch (err) {
      if (httpStatusOf((err as { cause?: unknown }).cause ?? err) === 404 || /HTTP 404/.test(String(err))) return null;
      throw err;
    }
  }

  /** Reads a Pod; `null` when absent. */
  getPod(namespace: string, name: string): Promise<V1Pod | null> {
    return this.call('get pod', (o) => this.core.readNamespacedPod({ namespace, name }, o), { status: 404, value: null });
  }

  /** Applies a JSON patch (RFC 6902) to a Pod; `null` when it is gone. */
  patchPod(namespace: string, name: string, ops: object[]): Promise<V1Pod | null> {
    return this.call('patch pod', (o) => this.core.patchNamespacedPod({ namespace, name, body: ops }, o), { status: 404, value: null });
  }

  /** Reads a Job; `null` when absent. */
  getJob(namespace: string, name: string): Promise<V1Job | null> {
    return this.call('get job', (o) => this.batch.readNamespacedJob({ namespace, name }, o), { status: 404, value: null });
  }

  /** Deletes a Job and, in the background, its pods and owned Secret. Absent is fine; with `uid`, so is one of that name with another uid (not touched). */
  async deleteJob(namespace: string, name: string, uid?: string): Promise<void> {
    try {
      await this.call(
        'delete job',
        async (o) => {
          // batch/v1 Jobs default to orphaning their pods: say Background explicitly.
          if (uid === undefined) await this.batch.deleteNamespacedJob({ namespace, name, propagationPolicy: 'Background', gracePeriodSeconds: 0 }, o);
          else await this.batch.deleteNamespacedJob({ namespace, name, body: { propagationPolicy: 'Background', gracePeriodSeconds: 0, preconditions: { uid } } }, o);
          return true;
        },
        { status: 404, value: false },
      );
    } catch (err) {
      // `uid` given: a Job of that name with another uid (a later attempt's) is not the one meant.
      if (uid !== undefined && /HTTP 409/.test(String(err))) return;
      throw err;
    }
  }

  /**
   * Deletes a Job only if it is still at `resourceVersion` (delete preconditions): `false` when it
   * changed meanwhile (409, e.g. a pool Job another replica just claimed) or is gone.
   */
  async deleteJobIfUnchanged(namespace: string, name: string, resourceVersion: string): Promise<boolean> {
    try {
      return await this.call(
        'delete job',
        async (o) => {
          await this.batch.deleteNamespacedJob({ namespace, name, body: { propagationPolicy: 'Background', gracePeriodSeconds: 0, preconditions: { resourceVersion } } }, o);
          return true;
        },
        { status: 404, value: false },
      );
    } catch (err) {
      if (/HTTP 409/.test(String(err))) return false;
      throw err;
    }
  }

  /**
   * Creates a Job and gives the uid the server gave it; `null` when one of that name exists (409).
   * The answer is read as plain JSON for its uid only (send-json.ts): the runs' path needs no more.
   */
  createJobUid(job: V1Job): Promise<string | null> {
    const namespace = job.metadata?.namespace ?? '';
    if (this.kc.getCurrentCluster()?.proxyUrl) return this.createJob(job).then((j) => (j ? (j.metadata?.uid ?? '') : null));
    const query = { timeout: `${Math.max(1, Math.ceil(this.requestTimeoutMs / 1000))}s` };
    const apiPath = `/apis/batch/v1/namespaces/${encodeURIComponent(namespace)}/jobs`;
    const send = (signal: AbortSignal) => sendJson(this.kc, (tls, secure) => this.agentFor(tls, secure), { method: 'POST', apiPath, query, body: job, signal, read: true });
    return this.call('create job', (_o, signal) => send(signal).then((r) => (r.json as V1Job | undefined)?.metadata?.uid ?? ''), { status: 409, value: null });
  }

  /** Creates a Secret; `false` if one of that name exists (409). Its answer is not read (send-json.ts), but through a proxy. */
  createSecret(secret: V1Secret): Promise<boolean> {
    const namespace = secret.metadata?.namespace ?? '';
    const query = { timeout: `${Math.max(1, Math.ceil(this.requestTimeoutMs / 1000))}s` };
    const apiPath = `/api/v1/namespaces/${encodeURIComponent(namespace)}/secrets`;
    const direct = !this.kc.getCurrentCluster()?.proxyUrl;
    const send = (o: ConfigurationOptions, signal: AbortSignal) =>
      direct ? sendJson(this.kc, (tls, secure) => this.agentFor(tls, secure), { method: 'POST', apiPath, query, body: secret, signal }) : this.core.createNamespacedSecret({ namespace, body: secret }, o);
    return this.call('create secret', (o, signal) => send(o, signal).then(() => true), { status: 409, value: false });
  }

  /** Reads a Secret; `null` when absent. */
  getSecret(namespace: string, name: string): Promise<V1Secret | null> {
    return this.call('get secret', (o) => this.core.readNamespacedSecret({ namespace, name }, o), { status: 404, value: null });
  }

  /** Deletes a Secret. Absent is fine. */
  async deleteSecret(namespace: string, name: string): Promise<void> {
    await this.call(
      'delete secret',
      async (o) => {
        await this.core.deleteNamespacedSecret({ namespace, name }, o);
        return true;
      },
      { status: 404, value: false },
    );
  }

  /** Creates a ConfigMap; `false` if one of that name exists (409). */
  createConfigMap(cm: V1ConfigMap): Promise<boolean> {
    const namespace = cm.metadata?.namespace ?? '';
    return this.call('create configmap', (o) => this.core.createNamespacedConfigMap({ namespace, body: cm }, o).then(() => true), { status: 409, value: false });
  }

  /** Lists ConfigMaps matching a selector. */
  async listConfigMaps(namespace: string, labelSelector: string): Promise<V1ConfigMap[]> {
    return (await this.call('list configmaps', (o) => this.core.listNamespacedConfigMap({ namespace, labelSelector }, o))).items;
  }

  /** Deletes a ConfigMap. Absent is fine. */
  async deleteConfigMap(namespace: string, name: string): Promise<void> {
    await this.call(
      'delete configmap',
      async (o) => {
        await this.core.deleteNamespacedConfigMap({ namespace, name }, o);
        return true;
      },
      { status: 404, value: false },
    );
  }

  /** Lists Jobs matching a selector. */
  async listJobs(namespace: string, labelSelector: string, limit?: number): Promise<ListResult<V1Job>> {
    const res = await this.call('list jobs', (o) => this.batch.listNamespacedJob({ namespace, labelSelector, ...(limit ? { limit } : {}) }, o));
    return { items: res.items, resourceVersion: res.metadata?.resourceVersion ?? '' };
  }

  /** Lists Pods matching a selector. */
  async listPods(namespace: string, labelSelector: string): Promise<ListResult<V1Pod>> {
    const res = await this.call('list pods', (o) => this.core.listNamespacedPod({ namespace, labelSelector }, o));
    return { items: res.items, resourceVersion: res.metadata?.resourceVersion ?? '' };
  }

  /** Last lines of a container's log; empty when it cannot be read. */
  async podLogTail(namespace: string, name: string, container: string, tailLines = 40): Promise<string> {
    try {
      return await this.call('read pod log', (o) =>
        this.core.readNamespacedPodLog({ namespace, name, container, tailLines, limitBytes: 16 * 1024 }, o),
      );
    } catch {
      return '';
    }
  }

  /** A Service's ClusterIP and first port; null when it does not exist or has no ClusterIP (headless). */
  async serviceAddress(namespace: string, name: string): Promise<{ host: string; port: number } | null> {
    const svc = await this.call('read service', (o) => this.core.readNamespacedService({ namespace, name }, o), { status: 404, value: null });
    const host = svc?.spec?.clusterIP;
    const port = svc?.spec?.ports?.[0]?.port;
    return host && host !== 'None' && port ? { host, port } : null;
  }

  /** Whether a RuntimeClass exists. */
  runtimeClassExists(name: string): Promise<boolean> {
    return this.call(
      'get runtimeclass',
      async (o) => {
        await this.node.readRuntimeClass({ name }, o);
        return true;
      },
      { status: 404, value: false },
    );
  }

  /** Lists custom objects (JobTypes). */
  async listCustom<T>(group: string, version: string, namespace: string, plural: string): Promise<ListResult<T>> {
    const res = (await this.call('list ' + plural, (o) =>
      this.custom.listNamespacedCustomObject({ group, version, namespace, plural }, o),
    )) as { items?: T[]; metadata?: { resourceVersion?: string } };
    return { items: res.items ?? [], resourceVersion: res.metadata?.resourceVersion ?? '' };
  }

  /** Reads one custom object; `null` when absent. */
  getCustom<T>(group: string, version: string, namespace: string, plural: string, name: string): Promise<T | null> {
    return this.call('get ' + plural, (o) => this.custom.getNamespacedCustomObject({ group, version, namespace, plural, name }, o) as Promise<T>, { status: 404, value: null });
  }

  /** Patches a custom object's status subresource with a JSON patch (RFC 6902). */
  async patchCustomStatus(group: string, version: string, namespace: string, plural: string, name: string, patch: object[]): Promise<void> {
    await this.call('patch ' + plural + '/status', (o) => this.custom.patchNamespacedCustomObjectStatus({ group, version, namespace, plural, name, body: patch }, o));
  }

  /** Reads a Lease (leader election); `null` when absent. */
  getLease(namespace: string, name: string): Promise<V1Lease | null> {
    return this.call('get lease', (o) => this.coordination.readNamespacedLease({ namespace, name }, o), { status: 404, value: null }, true);
  }

  /** Creates a Lease; `null` when one of that name exists already (409). */
  createLease(lease: V1Lease): Promise<V1Lease | null> {
    const namespace = lease.metadata?.namespace ?? '';
    return this.call('create lease', (o) => this.coordination.createNamespacedLease({ namespace, body: lease }, o), { status: 409, value: null }, true);
  }

  /** Replaces a Lease at the `resourceVersion` it carries; `null` when another writer changed it since (409). */
  replaceLease(lease: V1Lease): Promise<V1Lease | null> {
    const namespace = lease.metadata?.namespace ?? '';
    const name = lease.metadata?.name ?? '';
    return this.call('replace lease', (o) => this.coordination.replaceNamespacedLease({ namespace, name, body: lease }, o), { status: 409, value: null }, true);
  }

  /** Attaches to a running container's stdin/stdout (see attach.ts); a refused upgrade (4xx) is unretryable. */
  attach(namespace: string, pod: string, container: string, onStdout: (chunk: Buffer) => void): Promise<AttachSession> {
    return attachToContainer(this.kc, { namespace, pod, container, onStdout, handshakeTimeoutMs: this.requestTimeoutMs }).catch((err: unknown) => {
      if (err instanceof ExecError && err.httpStatus !== undefined) rethrow('attach', err);
      throw err;
    });
  }

  /**
   * Runs a command in a container; a refused upgrade (4xx) is unretryable like any other 4xx. The
   * upgrade must be answered within the request deadline; the whole exec within `timeoutMs`
   * (default {@link DEFAULT_EXEC_TIMEOUT_MS}).
   */
  exec(
    namespace: string,
    pod: string,
    container: string,
    command: readonly string[],
    opts: { stdout?: Writable; signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<ExecResult> {
    const timeoutMs = opts.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS;
    const handshakeTimeoutMs = Math.min(this.requestTimeoutMs, timeoutMs);
    return execInContainer(this.kc, { namespace, pod, container, command, ...opts, timeoutMs, handshakeTimeoutMs }).catch((err: unknown) => {
      if (err instanceof ExecError && err.httpStatus !== undefined) rethrow('exec', err);
      throw err;
    });
  }
}
