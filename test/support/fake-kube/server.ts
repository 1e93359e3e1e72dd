/**
 * An in-repo fake Kubernetes API server over real HTTP, for adapter tests and the bench. It behaves
 * like the real one where the runtime depends on it:
 *
 * - list/watch with resourceVersion (events after the given version are replayed), optional
 *   bookmarks, `410 Gone` (an ERROR event, or an HTTP 410 in `goneAsHttp` mode) when the version is
 *   older than the retained history (`compact()`), `timeoutSeconds`, server-side watch closes;
 * - create/get/delete of Jobs, Secrets and Pods with 409 AlreadyExists / 404 NotFound Status bodies
 *   and `propagationPolicy` (Jobs default to Orphan as in batch/v1; Background/Foreground delete the
 *   owned pods and Secrets, each pod with its own grace period, as the garbage collector does);
 * - pod deletion as the API server and kubelet do it: a pod not bound to a node, or already finished,
 *   goes at once, as does one deleted with `gracePeriodSeconds: 0`; any other lingers with
 *   `deletionTimestamp` (now + the delete's `gracePeriodSeconds`, else the pod's
 *   `terminationGracePeriodSeconds`, else 30 s), its running containers get SIGTERM and move to
 *   terminated (the run pod's: the runner kills the program and exits 137, the collector traps TERM
 *   and exits 0, others die of the signal, 143; a container in `sigtermIgnoredBy` is killed at the
 *   end of the grace period, 137), and the object disappears once they all stopped;
 * - a Job creates its pod the way the Job controller does (`<job>-<5 chars>`, `job-name` and
 *   `controller-uid` labels, a controller ownerReference) and follows the pod to Complete/Failed;
 * - pod status driven by the test (init running, main running/terminated with exit code and reason,
 *   OOMKilled, image pull errors, unschedulable, eviction, deletion, the Job deadline);
 * - RuntimeClasses and JobType custom resources;
 * - exec over WebSocket with the `v5.channel.k8s.io` / `v4.channel.k8s.io` subprotocols: channel
 *   byte first (1 stdout, 2 stderr, 3 Status JSON; v5 also 255 = close channel), opening with the
 *   empty frame a real server sends on each channel it writes; the collector's `tar` is the real
 *   `tar` command run over a temporary directory holding the pod's `/output` (or a canned archive
 *   for hostile cases), streamed as it runs; and the release command that lets the collector exit.
 *
 * - faults as real servers have them: injected error answers (`failNext`, optionally after the write
 *   was carried out, as when the server times out after etcd stored it), an outage (`setDown`),
 *   watch events piling up into one read (`holdEvents`/`releaseEvents`).
 *
 * Every request is counted (`requests`), so tests and the bench can assert API calls per run.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo, Socket } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';
import { WebSocketServer, type WebSocket } from 'ws';
import { writeOutputDir, type RunOutputs } from './tar.ts';

/** A stored object (JSON as the API would serve it). */
export type KObj = {
  apiVersion?: string;
  kind?: string;
  metadata: {
    name: string;
    namespace?: string;
    uid: string;
    resourceVersion: string;
    creationTimestamp: string;
    deletionTimestamp?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string; controller?: boolean }[];
    generateName?: string;
    [k: string]: unknown;
  };
  spec?: any;
  status?: any;
  [k: string]: unknown;
};

type Kind = 'pods' | 'secrets' | 'jobs' | 'runtimeclasses' | 'jobtypes' | 'namespaces';

interface WatchEvent {
  rv: number;
  kind: Kind;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  obj: KObj;
}

interface Watcher {
  kind: Kind;
  ns: string | null;
  selector: Selector;
  res: http.ServerResponse;
  bookmarks: boolean;
}

/** A logged request. */
export interface LoggedRequest {
  method: string;
  path: string;
  watch: boolean;
  at: number;
}

/** One exec the fake received. */
export interface ExecCall {
  namespace: string;
  pod: string;
  container: string;
  command: string[];
  protocol: string;
}

/** A test-supplied exec behaviour: return what to stream, or undefined to use the default. */
export type ExecHandler = (call: ExecCall) =>
  | { stdout?: Buffer; stderr?: string; exitCode?: number; delayMs?: number; breakAfterBytes?: number }
  | undefined;

/** Options of {@link FakeKube.start}. */
export interface FakeKubeOptions {
  /** Exec subprotocols the server accepts, in its order of preference. */
  execProtocols?: string[];
  /** Namespaces that exist. */
  namespaces?: string[];
  /** Answer a too-old watch with HTTP 410 instead of a 200 + ERROR event. */
  goneAsHttp?: boolean;
  /** Create the Job's pod automatically (default true). */
  jobCreatesPod?: boolean;
  /**
   * How long the kubelet takes to remove a gracefully deleted pod once its containers stopped, ms
   * (default 20; kubelet 1.20 waits for its container garbage collection, up to a minute).
   */
  podDeletionDelayMs?: number;
  /** How long containers take to stop after SIGTERM, ms (default 10). */
  containerStopMs?: number;
  /** Containers (by name) that ignore SIGTERM: killed (137) when the grace period ends. */
  sigtermIgnoredBy?: string[];
  /** Bind each new pod to the node at once, as an idle scheduler does (default false: tests schedule). */
  schedulePods?: boolean;
}

type Selector = { key: string; op: '=' | '!=' | 'exists' | '!exists'; value?: string }[];

function parseSelector(s: string | null): Selector {
  if (!s) return [];
  return s.split(',').filter(Boolean).map((part) => {
    const neq = part.split('!=');
    if (neq.length === 2) return { key: neq[0]!.trim(), op: '!=' as const, value: neq[1]!.trim() };
    const eq = part.split(/==?/);
    if (eq.length === 2) return { key: eq[0]!.trim(), op: '=' as const, value: eq[1]!.trim() };
    if (part.startsWith('!')) return { key: part.slice(1).trim(), op: '!exists' as const };
    return { key: part.trim(), op: 'exists' as const };
  });
}

function matches(sel: Selector, obj: KObj): boolean {
  const labels = obj.metadata.labels ?? {};
  return sel.every((r) => {
    const v = labels[r.key];
    if (r.op === '=') return v === r.value;
    if (r.op === '!=') return v !== r.value;
    if (r.op === 'exists') return v !== undefined;
    return v === undefined;
  });
}

/** RFC 3339 with second precision, as Kubernetes writes timestamps. */
export function kubeTime(ms = Date.now()): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

const clone = <T>(o: T): T => JSON.parse(JSON.stringify(o)) as T;

function status(code: number, reason: string, message: string, details?: object): object {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code, ...(details ? { details } : {}) };
}

const KIND_META: Record<Kind, { apiVersion: string; kind: string }> = {
  pods: { apiVersion: 'v1', kind: 'Pod' },
  secrets: { apiVersion: 'v1', kind: 'Secret' },
  jobs: { apiVersion: 'batch/v1', kind: 'Job' },
  runtimeclasses: { apiVersion: 'node.k8s.io/v1', kind: 'RuntimeClass' },
  jobtypes: { apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType' },
  namespaces: { apiVersion: 'v1', kind: 'Namespace' },
};

/** See the module comment. */
export class FakeKube {
  readonly requests: LoggedRequest[] = [];
  readonly execs: ExecCall[] = [];
  /** Epoch ms at which the test marked a pod's main container terminated, by pod name. */
  readonly mainTerminatedAt = new Map<string, number>();
  url = '';
  private rv = 100;
  private readonly store = new Map<Kind, Map<string, KObj>>();
  private history: WatchEvent[] = [];
  private oldestRv = 0;
  private readonly watchers = new Set<Watcher>();
  private readonly sockets = new Set<Socket>();
  /** Canned archives (hostile cases) by pod name; otherwise `tar` runs over `outputDir(pod)`. */
  private readonly outputs = new Map<string, Buffer>();
  private readonly root = mkdtempSync(path.join(tmpdir(), 'fake-kube-'));
  private readonly timers = new Set<NodeJS.Timeout>();
  private execHandler: ExecHandler | null = null;
  private readonly failures: { method?: string; path: RegExp; status: number; times: number; afterCommit: boolean }[] = [];
  private down = false;
  /** While set, watch events are kept per watch and written later in one chunk (`holdEvents`). */
  private held: Map<Watcher, string[]> | null = null;
  private readonly wss: WebSocketServer;
  private readonly server: http.Server;

  private constructor(readonly opts: FakeKubeOptions) {
    for (const k of Object.keys(KIND_META) as Kind[]) this.store.set(k, new Map());
    for (const ns of opts.namespaces ?? ['sandpod', 'sandpod-jobs']) this.put('namespaces', { metadata: { name: ns } as KObj['metadata'] }, false);
    const supported = opts.execProtocols ?? ['v5.channel.k8s.io', 'v4.channel.k8s.io'];
    this.wss = new WebSocketServer({
      noServer: true,
      perMessageDeflate: false,
      handleProtocols: (offered) => supported.find((p) => offered.has(p)) ?? false,
    });
    this.server = http.createServer((req, res) => void this.handle(req, res));
    this.server.on('upgrade', (req, socket, head) => this.upgrade(req, socket as Socket, head));
    this.server.on('connection', (s) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
  }

  /** Starts a fake on a free local port. */
  static async start(opts: FakeKubeOptions = {}): Promise<FakeKube> {
    const f = new FakeKube(opts);
    await new Promise<void>((resolve) => f.server.listen(0, '127.0.0.1', resolve));
    f.url = `http://127.0.0.1:${(f.server.address() as AddressInfo).port}`;
    return f;
  }

  /** Stops the server and drops every connection. */
  async close(): Promise<void> {
    for (const w of this.watchers) w.res.destroy();
    this.watchers.clear();
    for (const c of this.wss.clients) c.terminate();
    for (const s of this.sockets) s.destroy();
    for (const t of this.timers) clearTimeout(t);
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    rmSync(this.root, { recursive: true, force: true });
  }

  /** A KubeConfig pointing at this server (token auth, plain HTTP). */
  kubeConfig(): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'fake', server: this.url, skipTLSVerify: true }],
      users: [{ name: 'fake', token: 'fake-token' }],
      contexts: [{ name: 'fake', cluster: 'fake', user: 'fake' }],
      currentContext: 'fake',
    });
    return kc;
  }

  // ---------------------------------------------------------------- store

  private key(ns: string | undefined, name: string): string {
    return `${ns ?? ''}/${name}`;
  }

  private put(kind: Kind, obj: Omit<KObj, 'metadata'> & { metadata: Partial<KObj['metadata']> & { name: string } }, emit = true): KObj {
    const map = this.store.get(kind)!;
    const k = this.key(obj.metadata.namespace, obj.metadata.name);
    const existing = map.get(k);
    this.rv++;
    const stored: KObj = {
      ...KIND_META[kind],
      ...clone(obj),
      metadata: {
        ...clone(obj.metadata),
        uid: existing?.metadata.uid ?? obj.metadata.uid ?? randomUUID(),
        creationTimestamp: existing?.metadata.creationTimestamp ?? obj.metadata.creationTimestamp ?? kubeTime(),
        resourceVersion: String(this.rv),
      },
    } as KObj;
    map.set(k, stored);
    if (emit) this.emit(kind, existing ? 'MODIFIED' : 'ADDED', stored);
    return stored;
  }

  private remove(kind: Kind, ns: string | undefined, name: string): KObj | undefined {
    const map = this.store.get(kind)!;
    const k = this.key(ns, name);
    const obj = map.get(k);
    if (!obj) return undefined;
    map.delete(k);
    this.rv++;
    const gone = { ...obj, metadata: { ...obj.metadata, resourceVersion: String(this.rv) } };
    this.emit(kind, 'DELETED', gone);
    return gone;
  }

  private emit(kind: Kind, type: WatchEvent['type'], obj: KObj): void {
    const ev: WatchEvent = { rv: this.rv, kind, type, obj: clone(obj) };
    this.history.push(ev);
    if (this.history.length > 10_000) {
      this.history.splice(0, 5000);
      this.oldestRv = this.history[0]!.rv - 1;
    }
    for (const w of this.watchers) this.send(w, ev);
  }

  private send(w: Watcher, ev: WatchEvent): void {
    if (w.kind !== ev.kind) return;
    if (w.ns !== null && ev.obj.metadata.namespace !== w.ns) return;
    if (!matches(w.selector, ev.obj)) return;
    const line = JSON.stringify({ type: ev.type, object: ev.obj }) + '\n';
    if (this.held) this.held.set(w, [...(this.held.get(w) ?? []), line]);
    else w.res.write(line);
  }

  /** Every object of a kind (copies). */
  list(kind: Kind, ns?: string): KObj[] {
    return [...this.store.get(kind)!.values()].filter((o) => ns === undefined || o.metadata.namespace === ns).map(clone);
  }

  /** One object (a copy), or undefined. */
  get(kind: Kind, ns: string | undefined, name: string): KObj | undefined {
    const o = this.store.get(kind)!.get(this.key(ns, name));
    return o ? clone(o) : undefined;
  }

  // ---------------------------------------------------------------- control: cluster

  /** Forgets the watch history: a watch from any earlier resourceVersion gets 410 Gone. */
  compact(): void {
    this.history = [];
    this.oldestRv = this.rv;
  }

  /** Closes every open watch from the server side (like an API server restart or timeout). */
  closeWatches(): void {
    for (const w of this.watchers) w.res.end();
    this.watchers.clear();
  }

  /**
   * Holds watch events until {@link releaseEvents}, which writes each watch's events in one chunk: a
   * client then reads them in one go, as it does when a real server's events pile up in one TCP read.
   */
  holdEvents(): void {
    this.held ??= new Map();
  }

  /** Writes the events held since {@link holdEvents}, one chunk per watch, and stops holding. */
  releaseEvents(): void {
    const held = this.held;
    this.held = null;
    for (const [w, lines] of held ?? []) if (this.watchers.has(w)) w.res.write(lines.join(''));
  }

  /** Number of open watches. */
  get openWatches(): number {
    return this.watchers.size;
  }

  /** While down, every request is answered 503 (an API outage). */
  setDown(down: boolean): void {
    this.down = down;
  }

  /**
   * The next `times` requests matching get `status` (a Status body). With `afterCommit`, the request
   * is carried out first and only its answer is lost, as when a real API server times out after
   * etcd stored the write: the client sees an error, the object exists.
   */
  failNext(path: RegExp, statusCode: number, times = 1, method?: string, opts: { afterCommit?: boolean } = {}): void {
    this.failures.push({ path, status: statusCode, times, afterCommit: opts.afterCommit ?? false, ...(method ? { method } : {}) });
  }

  /** Requests other than watches since index `from`. */
  apiCalls(from = 0): LoggedRequest[] {
    return this.requests.slice(from).filter((r) => !r.watch);
  }

  addRuntimeClass(name: string, handler = 'runsc'): void {
    this.put('runtimeclasses', { metadata: { name }, handler });
  }

  deleteRuntimeClass(name: string): void {
    this.remove('runtimeclasses', undefined, name);
  }

  /** Creates or replaces a JobType custom resource. */
  upsertJobType(namespace: string, name: string, spec: object): KObj {
    return this.put('jobtypes', { metadata: { name, namespace }, spec });
  }

  deleteJobType(namespace: string, name: string): void {
    this.remove('jobtypes', namespace, name);
  }

  // ---------------------------------------------------------------- control: pods

  /** The pod of a Job (the first one), if it exists. */
  podOfJob(jobName: string): KObj | undefined {
    return this.list('pods').find((p) => p.metadata.labels?.['job-name'] === jobName);
  }

  /** Waits until the Job that now bears `jobName` has a pod, and returns that pod's name. */
  async waitForCurrentPod(jobName: string, ns = 'sandpod-jobs', timeoutMs = 5000): Promise<string> {
    let found = '';
    await this.waitFor(
      () => {
        const uid = this.get('jobs', ns, jobName)?.metadata.uid;
        const pod = uid ? this.list('pods', ns).find((p) => p.metadata.ownerReferences?.some((r) => r.uid === uid)) : undefined;
        found = pod?.metadata.name ?? '';
        return found !== '';
      },
      timeoutMs,
      `a pod of the current Job ${jobName}`,
    );
    return found;
  }

  /** Waits until a pod for the Job exists and returns its name. */
  async waitForPod(jobName: string, timeoutMs = 5000): Promise<string> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const p = this.podOfJob(jobName);
      if (p) return p.metadata.name;
      if (Date.now() > until) throw new Error(`no pod for job ${jobName} after ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  /** Waits until a condition over the fake's state holds. */
  async waitFor(cond: () => boolean, timeoutMs = 5000, what = 'condition'): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (!cond()) {
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  private findPod(name: string): KObj {
    const p = this.list('pods').find((x) => x.metadata.name === name);
    if (!p) throw new Error(`fake: no pod ${name}`);
    return p;
  }

  /** Applies a change to a pod's status (and recomputes its phase), emitting MODIFIED. */
  updatePod(name: string, mutate: (pod: KObj) => void, recompute = true): KObj {
    const pod = this.findPod(name);
    mutate(pod);
    if (recompute) pod.status.phase = podPhase(pod);
    const stored = this.put('pods', pod);
    this.syncJob(stored);
    return stored;
  }

  private setContainer(pod: KObj, container: string, state: object, extra: object = {}): void {
    const init = (pod.spec.initContainers ?? []).some((c: { name: string }) => c.name === container);
    const listKey = init ? 'initContainerStatuses' : 'containerStatuses';
    const list = (pod.status[listKey] ??= []) as { name: string }[];
    const spec = [...(pod.spec.initContainers ?? []), ...pod.spec.containers].find((c: { name: string }) => c.name === container);
    const i = list.findIndex((c) => c.name === container);
    const entry = { name: container, image: spec?.image ?? '', imageID: '', restartCount: 0, ready: false, started: false, state, ...extra };
    // Container states are the kubelet's: the pod is bound to a node by then.
    pod.spec.nodeName ??= 'fake-node';
    if (i >= 0) list[i] = entry;
    else list.push(entry);
  }

  /** Schedules the pod (PodScheduled=True) and shows containers creating. */
  schedule(name: string): void {
    this.updatePod(name, (p) => {
      p.spec.nodeName = 'fake-node';
      p.status.conditions = [{ type: 'PodScheduled', status: 'True', lastTransitionTime: kubeTime() }];
      p.status.startTime = kubeTime();
    });
  }

  /** PodScheduled=False, reason Unschedulable (as the scheduler reports it). */
  unschedulable(name: string, message = '0/3 nodes are available: 3 Insufficient memory.'): void {
    this.updatePod(name, (p) => {
      p.status.conditions = [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message, lastTransitionTime: kubeTime() }];
    });
  }

  /** Init container `deps` is running. */
  depsRunning(name: string): void {
    this.updatePod(name, (p) => {
      p.status.startTime ??= kubeTime();
      this.setContainer(p, 'deps', { running: { startedAt: kubeTime() } }, { started: true });
      for (const c of p.spec.containers) this.setContainer(p, c.name, { waiting: { reason: 'PodInitializing' } });
    });
  }

  /** Init container `deps` ended. */
  depsTerminated(name: string, exitCode: number, reason = exitCode === 0 ? 'Completed' : 'Error'): void {
    this.updatePod(name, (p) => {
      const started = p.status.initContainerStatuses?.find((c: { name: string }) => c.name === 'deps')?.state?.running?.startedAt ?? kubeTime();
      this.setContainer(p, 'deps', { terminated: { exitCode, reason, startedAt: started, finishedAt: kubeTime() } });
    });
  }

  /** A container is waiting with a reason (e.g. ErrImagePull, ImagePullBackOff, ContainerCreating). */
  waiting(name: string, container: string, reason: string, message = ''): void {
    this.updatePod(name, (p) => this.setContainer(p, container, { waiting: { reason, ...(message ? { message } : {}) } }));
  }

  /** `main` and `collector` are running. */
  mainRunning(name: string): void {
    this.updatePod(name, (p) => {
      p.status.startTime ??= kubeTime();
      this.setContainer(p, 'main', { running: { startedAt: kubeTime() } }, { started: true, ready: true });
      this.setContainer(p, 'collector', { running: { startedAt: kubeTime() } }, { started: true, ready: true });
    });
  }

  /** `main` ended (the runner exited); records the moment for overhead measurements. */
  mainTerminated(name: string, exitCode: number, reason = exitCode === 0 ? 'Completed' : 'Error'): void {
    this.updatePod(name, (p) => {
      const started = p.status.containerStatuses?.find((c: { name: string }) => c.name === 'main')?.state?.running?.startedAt ?? kubeTime();
      this.setContainer(p, 'main', { terminated: { exitCode, reason, startedAt: started, finishedAt: kubeTime() } });
    });
    this.mainTerminatedAt.set(name, performance.now());
  }

  /** A container ended (any container, e.g. the collector killed). */
  terminated(name: string, container: string, exitCode: number, reason: string): void {
    this.updatePod(name, (p) => this.setContainer(p, container, { terminated: { exitCode, reason, startedAt: kubeTime(), finishedAt: kubeTime() } }));
  }

  /** The kubelet evicted the pod (node pressure): phase Failed, reason Evicted, containers killed. */
  evict(name: string, message = 'The node was low on resource: memory.'): void {
    this.updatePod(
      name,
      (p) => {
        p.status.phase = 'Failed';
        p.status.reason = 'Evicted';
        p.status.message = message;
        for (const c of p.status.containerStatuses ?? []) {
          if (!c.state.terminated) c.state = { terminated: { exitCode: 137, reason: 'Error', startedAt: kubeTime(), finishedAt: kubeTime() } };
        }
      },
      false,
    );
  }

  /** Deletes a pod the way `kubectl delete pod` does: with its own grace period unless `graceSeconds` is given. */
  deletePod(name: string, graceSeconds?: number): void {
    const pod = this.findPod(name);
    this.deletePodObject(pod, graceSeconds);
  }

  /**
   * What the Job controller does when activeDeadlineSeconds passes: deletes the active pods first,
   * then records `Failed`/`DeadlineExceeded` on the Job.
   */
  async expireJobDeadline(jobName: string, ns = 'sandpod-jobs'): Promise<void> {
    for (const p of this.list('pods', ns).filter((x) => x.metadata.labels?.['job-name'] === jobName)) this.deletePodObject(p);
    await new Promise((r) => setTimeout(r, 20));
    const job = this.get('jobs', ns, jobName);
    if (!job) return;
    job.status = {
      ...job.status,
      active: 0,
      failed: 1,
      conditions: [{ type: 'Failed', status: 'True', reason: 'DeadlineExceeded', message: 'Job was active longer than specified deadline', lastTransitionTime: kubeTime() }],
    };
    this.put('jobs', job);
  }

  /**
   * What this pod's `/output` holds: written to the directory the collector's real `tar` archives.
   * A Buffer is a canned archive streamed as is, for hostile archives no directory can produce.
   */
  setOutput(podName: string, output: RunOutputs | Buffer): void {
    if (Buffer.isBuffer(output)) {
      this.outputs.set(podName, output);
      return;
    }
    this.outputs.delete(podName);
    const dir = this.outputDir(podName);
    rmSync(dir, { recursive: true, force: true });
    writeOutputDir(dir, output);
  }

  /** The directory standing for a pod's `/output` (empty until {@link setOutput}). */
  outputDir(podName: string): string {
    const dir = path.join(this.root, podName, 'output');
    mkdirSync(dir, { recursive: true });
    return dir;
  }

  /** Overrides exec behaviour (return undefined to fall back to the default). */
  onExec(handler: ExecHandler | null): void {
    this.execHandler = handler;
  }

  private later(ms: number, fn: () => void): void {
    const t = setTimeout(() => {
      this.timers.delete(t);
      fn();
    }, ms);
    t.unref();
    this.timers.add(t);
  }

  /**
   * Deletes a pod as the API server and the kubelet do (see the module comment). `graceSeconds`
   * is the delete's `gracePeriodSeconds`; undefined means the pod's own.
   */
  private deletePodObject(pod: KObj, graceSeconds?: number): void {
    const ns = pod.metadata.namespace;
    const name = pod.metadata.name;
    const grace = graceSeconds ?? pod.spec?.terminationGracePeriodSeconds ?? 30;
    const finished = pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed';
    if (grace === 0 || !pod.spec?.nodeName || finished) {
      this.remove('pods', ns, name);
      return;
    }
    if (pod.metadata.deletionTimestamp) return; // already terminating: the first grace period stands
    pod.metadata.deletionTimestamp = kubeTime(Date.now() + grace * 1000);
    (pod.metadata as Record<string, unknown>).deletionGracePeriodSeconds = grace;
    this.put('pods', pod);
    const ignored = new Set(this.opts.sigtermIgnoredBy ?? []);
    const stop = (exitCodeOf: (container: string) => number | null) => {
      const current = this.get('pods', ns, name);
      if (!current) return;
      this.updatePod(name, (p) => {
        for (const c of (p.status.containerStatuses ?? []) as { name: string; state: any }[]) {
          const code = c.state?.running ? exitCodeOf(c.name) : null;
          if (code === null) continue;
          c.state = { terminated: { exitCode: code, reason: code === 0 ? 'Completed' : 'Error', startedAt: c.state.running.startedAt, finishedAt: kubeTime() } };
        }
      });
      const after = this.get('pods', ns, name);
      const running = ((after?.status.containerStatuses ?? []) as { state: any }[]).some((c) => c.state?.running);
      if (after && !running) this.later(this.opts.podDeletionDelayMs ?? 20, () => this.remove('pods', ns, name));
    };
    // SIGTERM: what the run pod's containers do with it.
    this.later(this.opts.containerStopMs ?? 10, () =>
      stop((c) => (ignored.has(c) ? null : c === 'collector' ? 0 : c === 'main' ? 137 : 143)),
    );
    // The grace period ends: SIGKILL for whatever still runs.
    this.later(grace * 1000, () => stop(() => 137));
  }

  /** Follows a pod's phase onto its Job's status (Complete / Failed), like the Job controller. */
  private syncJob(pod: KObj): void {
    const jobName = pod.metadata.labels?.['job-name'];
    if (!jobName) return;
    const job = this.get('jobs', pod.metadata.namespace, jobName);
    if (!job || job.status?.conditions?.some((c: { status: string }) => c.status === 'True')) return;
    if (pod.status.phase === 'Succeeded') {
      job.status = { ...job.status, active: 0, succeeded: 1, completionTime: kubeTime(), conditions: [{ type: 'Complete', status: 'True', lastTransitionTime: kubeTime() }] };
      this.put('jobs', job);
    } else if (pod.status.phase === 'Failed') {
      job.status = {
        ...job.status,
        active: 0,
        failed: 1,
        conditions: [{ type: 'Failed', status: 'True', reason: 'BackoffLimitExceeded', message: 'Job has reached the specified backoff limit', lastTransitionTime: kubeTime() }],
      };
      this.put('jobs', job);
    }
  }

  private createPodForJob(job: KObj): void {
    const suffix = Math.random().toString(36).slice(2, 7).padEnd(5, 'x');
    const tpl = job.spec.template;
    const labels = {
      ...(tpl.metadata?.labels ?? {}),
      'controller-uid': job.metadata.uid,
      'job-name': job.metadata.name,
      'batch.kubernetes.io/controller-uid': job.metadata.uid,
      'batch.kubernetes.io/job-name': job.metadata.name,
    };
    const pod = {
      metadata: {
        name: `${job.metadata.name}-${suffix}`,
        generateName: `${job.metadata.name}-`,
        namespace: job.metadata.namespace,
        labels,
        annotations: { ...(tpl.metadata?.annotations ?? {}) },
        ownerReferences: [{ apiVersion: 'batch/v1', kind: 'Job', name: job.metadata.name, uid: job.metadata.uid, controller: true, blockOwnerDeletion: true }],
      },
      spec: clone(tpl.spec),
      status: {
        phase: 'Pending',
        qosClass: 'Guaranteed',
        ...(tpl.spec.initContainers?.length
          ? { initContainerStatuses: tpl.spec.initContainers.map((c: { name: string; image: string }) => ({ name: c.name, image: c.image, imageID: '', ready: false, restartCount: 0, state: { waiting: { reason: 'PodInitializing' } } })) }
          : {}),
        containerStatuses: tpl.spec.containers.map((c: { name: string; image: string }) => ({
          name: c.name,
          image: c.image,
          imageID: '',
          ready: false,
          restartCount: 0,
          started: false,
          state: { waiting: { reason: tpl.spec.initContainers?.length ? 'PodInitializing' : 'ContainerCreating' } },
        })),
      },
    };
    if (this.opts.schedulePods) {
      Object.assign(pod.spec, { nodeName: 'fake-node' });
      Object.assign(pod.status, { conditions: [{ type: 'PodScheduled', status: 'True', lastTransitionTime: kubeTime() }] });
    }
    this.put('pods', pod);
    job.status = { ...(job.status ?? {}), startTime: kubeTime(), active: 1 };
    this.put('jobs', job);
  }

  /** The collector exits 0 (its release file appeared). */
  private releaseCollector(pod: KObj): void {
    this.updatePod(pod.metadata.name, (p) =>
      this.setContainer(p, 'collector', { terminated: { exitCode: 0, reason: 'Completed', startedAt: kubeTime(), finishedAt: kubeTime() } }),
    );
  }

  // ---------------------------------------------------------------- HTTP

  private async body(req: http.IncomingMessage): Promise<any> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    return text ? JSON.parse(text) : undefined;
  }

  private json(res: http.ServerResponse, code: number, body: unknown): void {
    const text = JSON.stringify(body);
    res.writeHead(code, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://fake');
    const method = req.method ?? 'GET';
    const watch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
    this.requests.push({ method, path: url.pathname, watch, at: Date.now() });
    try {
      if (this.down) return this.json(res, 503, status(503, 'ServiceUnavailable', 'the fake API server is down'));
      const fail = this.failures.find((f) => f.times > 0 && f.path.test(url.pathname) && (!f.method || f.method === method));
      if (fail) {
        fail.times--;
        if (fail.afterCommit && !watch) await this.serve(req, discardingResponse(), url, method, watch);
        return this.json(res, fail.status, status(fail.status, 'InternalError', 'injected failure'));
      }
      return await this.serve(req, res, url, method, watch);
    } catch (err) {
      this.json(res, 500, status(500, 'InternalError', String(err)));
    }
  }

  private async serve(req: http.IncomingMessage, res: http.ServerResponse, url: URL, method: string, watch: boolean): Promise<void> {
    if (url.pathname === '/version') return this.json(res, 200, { major: '1', minor: '20', gitVersion: 'v1.20.0-fake' });
    const r = route(url.pathname);
    if (!r) return this.json(res, 404, status(404, 'NotFound', `the server could not find the requested resource (${url.pathname})`));
    const { kind, ns, name, sub } = r;
    if (sub === 'log' && method === 'GET') return this.podLog(res, ns!, name!, url.searchParams.get('container') ?? '');
    if (ns && kind !== 'namespaces' && !this.store.get('namespaces')!.has(this.key(undefined, ns)) && method === 'POST') {
      return this.json(res, 404, status(404, 'NotFound', `namespaces "${ns}" not found`));
    }
    if (!name) {
      if (method === 'GET' && watch) return this.watch(req, res, kind, ns, url);
      if (method === 'GET') return this.listHandler(res, kind, ns, url);
      if (method === 'POST') return this.create(res, kind, ns, await this.body(req));
    } else {
      if (method === 'GET') {
        const obj = this.get(kind, ns, name);
        return obj ? this.json(res, 200, obj) : this.json(res, 404, notFound(kind, name));
      }
      if (method === 'DELETE') return this.deleteHandler(res, kind, ns, name, url, await this.body(req).catch(() => undefined));
    }
    return this.json(res, 405, status(405, 'MethodNotAllowed', `${method} not allowed`));
  }

  private listHandler(res: http.ServerResponse, kind: Kind, ns: string | undefined, url: URL): void {
    const sel = parseSelector(url.searchParams.get('labelSelector'));
    let items = this.list(kind, ns).filter((o) => matches(sel, o));
    const limit = Number(url.searchParams.get('limit') ?? 0);
    if (limit > 0) items = items.slice(0, limit);
    this.json(res, 200, {
      apiVersion: KIND_META[kind].apiVersion,
      kind: `${KIND_META[kind].kind}List`,
      metadata: { resourceVersion: String(this.rv) },
      items,
    });
  }

  private watch(req: http.IncomingMessage, res: http.ServerResponse, kind: Kind, ns: string | undefined, url: URL): void {
    const from = url.searchParams.get('resourceVersion');
    const fromRv = from ? Number(from) : this.rv;
    if (from && fromRv < this.oldestRv) {
      const gone = status(410, 'Expired', `too old resource version: ${fromRv} (${this.oldestRv + 1})`);
      if (this.opts.goneAsHttp) return this.json(res, 410, gone);
      res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
      res.end(JSON.stringify({ type: 'ERROR', object: gone }) + '\n');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    const w: Watcher = {
      kind,
      ns: ns ?? null,
      selector: parseSelector(url.searchParams.get('labelSelector')),
      res,
      bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true',
    };
    for (const ev of this.history) if (ev.rv > fromRv) this.send(w, ev);
    this.watchers.add(w);
    const timeout = Number(url.searchParams.get('timeoutSeconds') ?? 0);
    const timer = timeout > 0 ? setTimeout(() => res.end(), timeout * 1000) : null;
    const bookmark = w.bookmarks
      ? setInterval(() => {
          res.write(JSON.stringify({ type: 'BOOKMARK', object: { kind: KIND_META[kind].kind, apiVersion: KIND_META[kind].apiVersion, metadata: { resourceVersion: String(this.rv) } } }) + '\n');
        }, 1000)
      : null;
    const cleanup = () => {
      if (timer) clearTimeout(timer);
      if (bookmark) clearInterval(bookmark);
      this.watchers.delete(w);
    };
    res.on('close', cleanup);
    req.on('close', cleanup);
  }

  private create(res: http.ServerResponse, kind: Kind, ns: string | undefined, body: any): void {
    const name = body?.metadata?.name;
    if (!name) return this.json(res, 422, status(422, 'Invalid', 'metadata.name: Required value'));
    if (this.get(kind, ns, name)) return this.json(res, 409, status(409, 'AlreadyExists', `${kind} "${name}" already exists`, { name, kind }));
    const obj = this.put(kind, { ...body, metadata: { ...body.metadata, namespace: ns } });
    this.json(res, 201, obj);
    if (kind === 'jobs' && this.opts.jobCreatesPod !== false) setImmediate(() => this.get('jobs', ns, name) && this.createPodForJob(this.get('jobs', ns, name)!));
  }

  private deleteHandler(res: http.ServerResponse, kind: Kind, ns: string | undefined, name: string, url: URL, body: any): void {
    const obj = this.get(kind, ns, name);
    if (!obj) return this.json(res, 404, notFound(kind, name));
    const policy: string = body?.propagationPolicy ?? url.searchParams.get('propagationPolicy') ?? (kind === 'jobs' ? 'Orphan' : 'Background');
    const graceRaw = body?.gracePeriodSeconds ?? url.searchParams.get('gracePeriodSeconds');
    const grace = graceRaw === null || graceRaw === undefined ? undefined : Number(graceRaw);
    if (kind === 'pods') {
      this.deletePodObject(obj, grace);
      return this.json(res, 200, obj);
    }
    const dependents = (k: Kind) => this.list(k, ns).filter((o) => o.metadata.ownerReferences?.some((r) => r.uid === obj.metadata.uid));
    if (policy === 'Orphan') {
      for (const k of ['pods', 'secrets'] as Kind[]) {
        for (const d of dependents(k)) {
          d.metadata.ownerReferences = d.metadata.ownerReferences?.filter((r) => r.uid !== obj.metadata.uid);
          this.put(k, d);
        }
      }
      this.remove(kind, ns, name);
    } else {
      this.remove(kind, ns, name);
      // The garbage collector removes dependents shortly after the owner, with default options: a
      // pod gets its own grace period, whatever the owner's delete said.
      setTimeout(() => {
        for (const d of dependents('pods')) this.deletePodObject(d);
        for (const d of dependents('secrets')) this.remove('secrets', ns, d.metadata.name);
      }, 5);
    }
    this.json(res, 200, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', details: { name, kind } });
  }

  private podLog(res: http.ServerResponse, ns: string, name: string, container: string): void {
    const pod = this.get('pods', ns, name);
    if (!pod) return this.json(res, 404, notFound('pods', name));
    const text = (pod.metadata.annotations?.[`fake.sandpod.io/log-${container}`] as string | undefined) ?? '';
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end(text);
  }

  /** Sets what `GET .../log?container=` returns for a pod's container. */
  setLog(podName: string, container: string, text: string): void {
    this.updatePod(podName, (p) => {
      p.metadata.annotations = { ...(p.metadata.annotations ?? {}), [`fake.sandpod.io/log-${container}`]: text };
    }, false);
  }

  // ---------------------------------------------------------------- exec

  private upgrade(req: http.IncomingMessage, socket: Socket, head: Buffer): void {
    const url = new URL(req.url ?? '/', 'http://fake');
    this.requests.push({ method: req.method ?? 'GET', path: url.pathname, watch: false, at: Date.now() });
    const refuse = (code: number, body: object) => {
      const text = JSON.stringify(body);
      socket.end(`HTTP/1.1 ${code} ${http.STATUS_CODES[code]}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\n\r\n${text}`);
    };
    if (this.down) return refuse(503, status(503, 'ServiceUnavailable', 'the fake API server is down'));
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/exec$/.exec(url.pathname);
    if (!m) return refuse(404, status(404, 'NotFound', 'not an exec path'));
    const [, ns, podName] = m as unknown as [string, string, string];
    const pod = this.get('pods', ns, podName);
    if (!pod) return refuse(404, notFound('pods', podName));
    const container = url.searchParams.get('container') ?? pod.spec.containers[0].name;
    const cs = (pod.status.containerStatuses ?? []).find((c: { name: string }) => c.name === container);
    if (!cs) return refuse(400, status(400, 'BadRequest', `container ${container} is not valid for pod ${podName}`));
    if (!cs.state?.running) return refuse(400, status(400, 'BadRequest', `container ${container} is not running`));
    const command = url.searchParams.getAll('command');
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      const call: ExecCall = { namespace: ns, pod: podName, container, command, protocol: ws.protocol };
      this.execs.push(call);
      void this.runExec(ws, call, pod);
    });
  }

  private async runExec(ws: WebSocket, call: ExecCall, pod: KObj): Promise<void> {
    const v5 = call.protocol === 'v5.channel.k8s.io';
    const frame = (channel: number, data: Buffer | string) => {
      if (ws.readyState !== ws.OPEN) return;
      const payload = Buffer.isBuffer(data) ? data : Buffer.from(data, 'utf8');
      ws.send(Buffer.concat([Buffer.from([channel]), payload]));
    };
    // A real API server opens every channel it writes (stdout, stderr, error) with an empty frame.
    for (const channel of [1, 2, 3]) frame(channel, Buffer.alloc(0));
    // Real servers send large outputs in many frames; so do we, respecting the socket's buffer.
    const CHUNK = 32 * 1024;
    const drained = async () => {
      while (ws.readyState === ws.OPEN && ws.bufferedAmount > 4 * CHUNK) await new Promise((r) => setTimeout(r, 1));
    };
    const custom = this.execHandler?.(call);
    let stderr = '';
    let exitCode = 0;
    const cmd = call.command.join(' ');
    const sendAll = async (stdout: Buffer) => {
      for (let i = 0; i < stdout.length; i += CHUNK) {
        if (ws.readyState !== ws.OPEN) return;
        frame(1, stdout.subarray(i, i + CHUNK));
        await drained();
      }
    };
    if (custom) {
      stderr = custom.stderr ?? '';
      exitCode = custom.exitCode ?? 0;
      if (custom.delayMs) await new Promise((r) => setTimeout(r, custom.delayMs));
      const stdout = custom.stdout ?? Buffer.alloc(0);
      if (custom.breakAfterBytes !== undefined) {
        frame(1, stdout.subarray(0, custom.breakAfterBytes));
        await new Promise((r) => setTimeout(r, 5));
        ws.terminate();
        return;
      }
      await sendAll(stdout);
    } else if (call.command[0] === 'tar') {
      const canned = this.outputs.get(call.pod);
      if (canned) await sendAll(canned);
      else ({ stderr, exitCode } = await this.runTar(ws, call, frame, drained));
    } else if (cmd.includes('/control/release')) {
      this.releaseCollector(pod);
    } else {
      stderr = `sh: ${call.command[0]}: not found\n`;
      exitCode = 127;
    }
    if (ws.readyState !== ws.OPEN) return;
    if (stderr) frame(2, stderr);
    if (v5) {
      ws.send(Buffer.from([255, 1]));
      ws.send(Buffer.from([255, 2]));
    }
    frame(
      3,
      JSON.stringify(
        exitCode === 0
          ? { metadata: {}, status: 'Success' }
          : {
              metadata: {},
              status: 'Failure',
              message: `command terminated with non-zero exit code: error executing command [${cmd}], exit code ${exitCode}`,
              reason: 'NonZeroExitCode',
              details: { causes: [{ reason: 'ExitCode', message: String(exitCode) }] },
            },
      ),
    );
    ws.close(1000);
  }

  /**
   * Runs the exec'd `tar` for real, with the container's `/output` standing for the pod's directory,
   * streaming its stdout as it comes (paused while the socket is backed up); killed if the client
   * goes away.
   */
  private runTar(
    ws: WebSocket,
    call: ExecCall,
    frame: (channel: number, data: Buffer) => void,
    drained: () => Promise<void>,
  ): Promise<{ stderr: string; exitCode: number }> {
    const dir = this.outputDir(call.pod);
    const args = call.command.slice(1).map((a) => (a === '/output' || a.startsWith('/output/') ? dir + a.slice('/output'.length) : a));
    return new Promise((resolve) => {
      const child = spawn('tar', args, { stdio: ['ignore', 'pipe', 'pipe'] });
      let stderr = '';
      const onClose = () => child.kill('SIGKILL');
      ws.once('close', onClose);
      child.stdout.on('data', (c: Buffer) => {
        frame(1, c);
        if (ws.bufferedAmount > 128 * 1024) {
          child.stdout.pause();
          void drained().then(() => child.stdout.resume());
        }
      });
      child.stderr.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
      child.on('error', (err) => {
        ws.off('close', onClose);
        resolve({ stderr: `tar: ${err.message}\n`, exitCode: 127 });
      });
      child.on('close', (code, signal) => {
        ws.off('close', onClose);
        resolve({ stderr, exitCode: code ?? (signal ? 137 : 1) });
      });
    });
  }
}

/** A response that goes nowhere: the answer of a request whose reply is lost (`failNext` afterCommit). */
function discardingResponse(): http.ServerResponse {
  const sink = { writeHead: () => sink, write: () => true, end: () => sink, flushHeaders: () => undefined, on: () => sink };
  return sink as unknown as http.ServerResponse;
}

function notFound(kind: Kind, name: string): object {
  return status(404, 'NotFound', `${kind} "${name}" not found`, { name, kind });
}

/** Phase of a pod with restartPolicy Never, from its container states. */
function podPhase(pod: KObj): string {
  if (pod.status.reason === 'Evicted') return 'Failed';
  const inits = (pod.status.initContainerStatuses ?? []) as { state: any }[];
  if (inits.some((c) => c.state?.terminated && c.state.terminated.exitCode !== 0)) return 'Failed';
  if (inits.some((c) => !c.state?.terminated)) return 'Pending';
  const cs = (pod.status.containerStatuses ?? []) as { state: any }[];
  if (cs.length > 0 && cs.every((c) => c.state?.terminated)) return cs.some((c) => c.state.terminated.exitCode !== 0) ? 'Failed' : 'Succeeded';
  if (cs.some((c) => c.state?.running || c.state?.terminated)) return 'Running';
  return 'Pending';
}

function route(path: string): { kind: Kind; ns?: string; name?: string; sub?: string } | null {
  let m = /^\/api\/v1\/namespaces\/([^/]+)\/(pods|secrets)(?:\/([^/]+))?(?:\/(log|exec))?$/.exec(path);
  if (m) return { kind: m[2] as Kind, ns: m[1]!, ...(m[3] ? { name: m[3] } : {}), ...(m[4] ? { sub: m[4] } : {}) };
  m = /^\/apis\/batch\/v1\/namespaces\/([^/]+)\/jobs(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'jobs', ns: m[1]!, ...(m[2] ? { name: m[2] } : {}) };
  m = /^\/apis\/node\.k8s\.io\/v1\/runtimeclasses(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'runtimeclasses', ...(m[1] ? { name: m[1] } : {}) };
  m = /^\/apis\/sandpod\.io\/v1alpha1\/namespaces\/([^/]+)\/jobtypes(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'jobtypes', ns: m[1]!, ...(m[2] ? { name: m[2] } : {}) };
  m = /^\/api\/v1\/namespaces(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'namespaces', ...(m[1] ? { name: m[1] } : {}) };
  return null;
}
