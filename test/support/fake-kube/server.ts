/**
 * An in-repo fake Kubernetes API server over real HTTP, for adapter tests and the bench. It behaves
 * like the real one where the runtime depends on it:
 *
 * - list/watch with resourceVersion (events after the given version are replayed), optional
 *   bookmarks, `410 Gone` (an ERROR event, or an HTTP 410 in `goneAsHttp` mode) when the version is
 *   older than the retained history (`compact()`), `timeoutSeconds`, server-side watch closes;
 * - create/get/delete of Jobs, Secrets, ConfigMaps and Pods with 409 AlreadyExists / 404 NotFound Status bodies
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
 *   the pod's `status.qosClass` is computed from its containers' requests and limits (`qos.ts`);
 * - pod status driven by the test (init running, main running/terminated with exit code and reason,
 *   OOMKilled, image pull errors, unschedulable, eviction, deletion, the Job deadline);
 * - RuntimeClasses and JobType custom resources;
 * - container logs (`GET .../log`): 400 while the container waits to start, `limitBytes`, and
 *   `follow=true` streaming what the container writes (`appendLog`) until the container ends;
 * - exec over WebSocket with the `v5.channel.k8s.io` / `v4.channel.k8s.io` subprotocols: channel
 *   byte first (1 stdout, 2 stderr, 3 Status JSON; v5 also 255 = close channel), opening with the
 *   empty frame a real server sends on each channel it writes; the collector's `tar` is the real
 *   `tar` command run over a temporary directory holding the pod's `/output` (or a canned archive
 *   for hostile cases), streamed as it runs; the release command that lets the collector exit; and
 *   a new holder's fence (the claim command, run for real on the pod's `/control`);
 * - attach over WebSocket (same subprotocols): the client's channel-0 frames go to the container's
 *   stdin, its stdout comes back on channel 1 from the moment of the attach; refused (400) when the
 *   container is not running or its spec has no `stdin`; with `stdinOnce` the container's stdin is
 *   closed when the first attach ends (`attachDropsBeforeStdin` cuts attaches to a `collector` mid
 *   hand-over). With `runWarmPods`, a pod whose `collector` declares `stdin` (pool and cold attach pods)
 *   runs, as soon as it starts, the real runner of `main`'s command and the real deliver.py of the
 *   collector's (paths /code, /input, /output, /tmp, /control mapped to directories of the fake, the go
 *   port to one of its own per pod), so the hand-over, the go line, the run and `done N` are theirs;
 *   `main`'s stdout and stderr are its log, the collector's stdout its; `main` terminates with the runner's exit status;
 *   the command's `$(VAR)` references are expanded from the container's env as the kubelet does
 *   (`fieldRef: status.podIP` is the pod's IP, 127.0.0.1 here), and a `tcpSocket` startup probe of
 *   `main` runs as the kubelet runs it: `main` is `started: false, ready: false` until a TCP
 *   connection to the probed port (mapped, like the go port, to one of the pod's own) succeeds, tried
 *   every `probePeriodMs` (the probe's `periodSeconds`, scaled down); `ready` follows `started` after
 *   `probeReadyLagMs` (a kubelet's next sync of the pod);
 * - update (PUT) with optimistic concurrency: a `resourceVersion` other than the stored one is 409
 *   Conflict, as the API server answers; JSON patch (RFC 6902 add/replace/remove), a patched
 *   `metadata.resourceVersion` being a precondition (409) as on the API server.
 *
 * - a `collector` whose deliver.py exits by itself with a failure ends as a container does
 *   (terminated with that exit code, after its start was reported); `collectorStdinClosedJobs`
 *   closes the stdin of those Jobs' pods as they start (a fault kcluster's gVisor adapter was seen with);
 * - faults as real servers have them: injected error answers (`failNext`, optionally after the write
 *   was carried out, as when the server times out after etcd stored it), an outage (`setDown`),
 *   watch events piling up into one read (`holdEvents`/`releaseEvents`), and a hang (`hang`): an
 *   API server that accepts requests and never answers them — calls and exec upgrades held without
 *   a byte, watches answered with their headers and then silent, past their `timeoutSeconds`, without
 *   closing (open watches stall too) — until `clearHang`, when held requests whose client is still
 *   there are carried out and answered, those whose client gave up are dropped (a real server
 *   cancels a request whose connection closed), and stalled watches deliver what they held;
 * - watches as a real server runs them: headers flushed at once, closed cleanly at `timeoutSeconds`
 *   (without it, at a random 30–60 min, the server's own min-request-timeout window).
 *
 * Every request is counted (`requests`), so tests and the bench can assert API calls per run.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import type { AddressInfo, Socket } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';
import { WebSocketServer, type WebSocket } from 'ws';
import { qosClassOf } from './qos.ts';
import { writeOutputDir, type RunOutputs } from './tar.ts';

/** The range warm pods' go ports are taken from (see FakeKube.nextGoPort). */
const GO_PORT_MIN = 12000;
const GO_PORT_MAX = 32000;

/** Local TCP ports of this machine's sockets, in any state (Linux's /proc/net/tcp and tcp6; empty elsewhere). */
function localPortsInUse(): Set<number> {
  const ports = new Set<number>();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    // `  sl  local_address rem_address st ...`: the local address is HEXIP:HEXPORT.
    for (const line of text.split('\n').slice(1)) {
      const local = line.trim().split(/\s+/)[1];
      if (local) ports.add(parseInt(local.slice(local.lastIndexOf(':') + 1), 16));
    }
  }
  return ports;
}

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

type Kind = 'pods' | 'secrets' | 'configmaps' | 'jobs' | 'runtimeclasses' | 'jobtypes' | 'namespaces' | 'services' | 'leases';

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
  /** While the server hangs: events this watch would have written, and nothing is written. */
  stalled: string[] | null;
  /** When the server closes it (its `timeoutSeconds`), epoch ms. */
  closeAt: number;
  timer: NodeJS.Timeout | null;
}

/** A hang in force (see {@link FakeKube.hang}). */
export interface HangOptions {
  /** Paths that hang (default: all). */
  path?: RegExp;
  /** Only this verb (default: all). */
  method?: string;
  /** Only watches, or only everything else (calls and exec upgrades); default both. */
  only?: 'watches' | 'requests';
  /**
   * A new watch gets its headers and then nothing (`silent`, default: the watch is registered and
   * the server stops talking), or no answer at all (`unanswered`, like any other request).
   */
  watches?: 'silent' | 'unanswered';
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
  /**
   * Pods whose `main` declares `stdin` (warm pool pods) start by themselves a few ms after creation
   * and run the real runner of their command (see the module comment).
   */
  runWarmPods?: boolean;
  /** The period of warm pods' `tcpSocket` startup probes, ms (default 25; a kubelet's is the probe's `periodSeconds`). */
  probePeriodMs?: number;
  /**
   * Keep `metadata.managedFields` on every stored object as a real API server does (server-side
   * apply's field ownership: one FieldsV1 entry naming every field set). Off by default (the tests
   * compare objects); the in-flight bench turns it on, since it is what an informer caches from a
   * real server.
   */
  managedFields?: boolean;
}

/** FieldsV1 of an object: every field it sets, as `f:<name>` keys (lists as `.`), as the API server writes. */
function fieldsV1(o: unknown): Record<string, unknown> {
  // Plain loops: the in-flight bench computes this on every write, and the fake's CPU shares the
  // machine with the replica it measures.
  const out: Record<string, unknown> = {};
  if (Array.isArray(o)) {
    for (let i = 0; i < o.length; i++) {
      const x: unknown = o[i];
      const entry: Record<string, unknown> = { '.': {} };
      if (x && typeof x === 'object') Object.assign(entry, fieldsV1(x));
      out[x && typeof x === 'object' && 'name' in x ? `k:{"name":"${String((x as { name: unknown }).name)}"}` : `i:${i}`] = entry;
    }
  } else if (o && typeof o === 'object') {
    for (const [k, v] of Object.entries(o)) out[`f:${k}`] = v && typeof v === 'object' ? fieldsV1(v) : {};
  }
  return out;
}

/** One attach the fake received. */
export interface AttachCall {
  namespace: string;
  pod: string;
  container: string;
  protocol: string;
  /** Everything the client wrote to stdin. */
  stdin: Buffer[];
  /** The stream ended (either side closed it, or the container ended). */
  ended: boolean;
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
  configmaps: { apiVersion: 'v1', kind: 'ConfigMap' },
  jobs: { apiVersion: 'batch/v1', kind: 'Job' },
  runtimeclasses: { apiVersion: 'node.k8s.io/v1', kind: 'RuntimeClass' },
  jobtypes: { apiVersion: 'sandpod.io/v1alpha1', kind: 'JobType' },
  namespaces: { apiVersion: 'v1', kind: 'Namespace' },
  services: { apiVersion: 'v1', kind: 'Service' },
  leases: { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease' },
};

/** See the module comment. */
export class FakeKube {
  readonly requests: LoggedRequest[] = [];
  readonly execs: ExecCall[] = [];
  readonly attaches: AttachCall[] = [];
  /** Open attach streams by pod name (`dropAttaches` cuts them, as an API server restart would). */
  private readonly openAttaches = new Map<string, Set<WebSocket>>();
  /**
   * Fault: the next this-many attaches to a `main` container drop the connection on the client's
   * first stdin frame without passing it on (a proxy or API server cut mid hand-over). With
   * `stdinOnce` the container's stdin then closes, so its runner sees EOF before its go line.
   */
  attachDropsBeforeStdin = 0;
  /**
   * Fault: the `collector` (deliver.py) of the pods of these Jobs finds its stdin closed as it starts,
   * before any attach: what kcluster's gVisor adapter was seen doing (the collector read EOF while the
   * attach's bytes sat in its stdin pipe on the host).
   */
  readonly collectorStdinClosedJobs = new Set<string>();
  /**
   * Fault: images the node cannot pull. A warm pod with one waits in ErrImagePull, then
   * ImagePullBackOff, and never starts, as the kubelet leaves it.
   */
  readonly unpullable = new Set<string>();
  /**
   * How long the status of a warm pod's started `main` trails its start, ms (a kubelet reports it at
   * its next status sync, up to a second later); attach reaches the running process meanwhile. 0: at once.
   */
  statusLagMs = 0;
  /** How much later than a start (statusLagMs) the end of a collector the fake runs is reported, ms (a kubelet slow to sync). */
  collectorEndLagMs = 0;
  /** Fault: `main`'s process in pods the fake runs starts this long after the collector's (a node slow to start it), ms. */
  mainStartDelayMs = 0;
  /** Fault: pods the fake runs start their containers this long after they were made (a loaded node: sandbox, volumes), ms. */
  podStartDelayMs = 0;
  /**
   * How long after main's startup probe passed (`started: true`) its `ready` follows, ms. A kubelet
   * sets `ready` at its next sync of the pod; Kubernetes 1.20 waited for the periodic one (up to a
   * minute) when the probe passed after the containers' last start. 0: at once.
   */
  probeReadyLagMs = 0;
  /** Startup probe connections that succeeded (one per warm pod that became ready). */
  probeConnects = 0;
  /** Attaches refused because the container was not running (yet). */
  attachRefusals = 0;
  /** Exec upgrades refused because the container had not started. */
  execRefusals = 0;
  /** Warm pods' runner processes (`main`) by pod name (runWarmPods). */
  private readonly procs = new Map<string, { child: import('node:child_process').ChildProcess; sinks: Set<(b: Buffer) => void>; attached: boolean }>();
  /** Their `collector` processes (deliver.py, the attach target) by pod name. */
  private readonly delivers = new Map<string, { child: import('node:child_process').ChildProcess; sinks: Set<(b: Buffer) => void>; attached: boolean }>();
  /** Pods whose containers were started (main's process spawned, the collector with it), reported or not. */
  private readonly startedPods = new Set<string>();
  /**
   * The go port of the next warm pod (runner.py --go-port), one per pod: below the kernel's ephemeral
   * range (32768 and up by default), where a busy machine's outgoing connections take local ports and
   * a runner's bind would fail (it exits 125 and the run fails for the fake, not the service).
   */
  private nextGoPort = GO_PORT_MIN + Math.floor(Math.random() * (GO_PORT_MAX - GO_PORT_MIN));
  private takeGoPort(busy: ReadonlySet<number> = localPortsInUse()): number {
    // Not one a socket on this machine holds already (another service's listener, another test
    // file's fake pods): a pod of a real cluster has its network namespace to itself.
    for (let tries = 0; ; tries++) {
      const port = this.nextGoPort;
      this.nextGoPort = port + 1 >= GO_PORT_MAX ? GO_PORT_MIN : port + 1;
      if (!busy.has(port) || tries >= GO_PORT_MAX - GO_PORT_MIN) return port;
    }
  }
  /** Epoch ms at which the test marked a pod's main container terminated, by pod name. */
  readonly mainTerminatedAt = new Map<string, number>();
  /** Pods whose main `oomKill` ended: the runner's exit does not overwrite that status. */
  private readonly oomKilledPods = new Set<string>();
  url = '';
  private rv = 100;
  private readonly store = new Map<Kind, Map<string, KObj>>();
  private history: WatchEvent[] = [];
  private oldestRv = 0;
  private readonly watchers = new Set<Watcher>();
  private readonly sockets = new Set<Socket>();
  /** Canned archives (hostile cases) by pod name; otherwise `tar` runs over `outputDir(pod)`. */
  private readonly outputs = new Map<string, Buffer>();
  /** Container logs by `ns/pod/container`, and the follows (`?follow=true`) reading them. */
  private readonly logs = new Map<string, Buffer>();
  private readonly logFollowers = new Map<string, Set<{ res: http.ServerResponse; left: number }>>();
  private readonly root = mkdtempSync(path.join(tmpdir(), 'fake-kube-'));
  private readonly timers = new Set<NodeJS.Timeout>();
  private execHandler: ExecHandler | null = null;
  private readonly failures: { method?: string; path: RegExp; status: number; times: number; afterCommit: boolean }[] = [];
  private down = false;
  private readonly hangs: HangOptions[] = [];
  /** Requests held by a hang: carried out on `clearHang` if their client is still there. */
  private readonly heldRequests: { run: () => void; gone: () => boolean }[] = [];
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
    this.hangs.length = 0;
    this.heldRequests.length = 0;
    for (const w of this.watchers) {
      if (w.timer) clearTimeout(w.timer);
      w.res.destroy();
    }
    this.watchers.clear();
    for (const c of this.wss.clients) c.terminate();
    for (const p of [...this.procs.values(), ...this.delivers.values()]) p.child.kill('SIGKILL');
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

  /**
   * Stores an object (a new resourceVersion) and emits its event. Stored objects are never changed in
   * place (readers get copies, `peek` is read-only), so the store, the watch history and the events
   * share one copy. `owned`: `obj` is already a copy nobody else holds (e.g. from `findPod`).
   */
  private put(kind: Kind, obj: Omit<KObj, 'metadata'> & { metadata: Partial<KObj['metadata']> & { name: string } }, emit = true, owned = false): KObj {
    const map = this.store.get(kind)!;
    const k = this.key(obj.metadata.namespace, obj.metadata.name);
    const existing = map.get(k);
    this.rv++;
    const copy = owned ? obj : clone(obj);
    const stored: KObj = {
      ...KIND_META[kind],
      ...copy,
      metadata: {
        ...copy.metadata,
        uid: existing?.metadata.uid ?? obj.metadata.uid ?? randomUUID(),
        creationTimestamp: existing?.metadata.creationTimestamp ?? obj.metadata.creationTimestamp ?? kubeTime(),
        resourceVersion: String(this.rv),
      },
    } as KObj;
    if (this.opts.managedFields) {
      const { metadata, ...rest } = stored;
      const { managedFields: _drop, resourceVersion: _rv, uid: _uid, creationTimestamp: _ct, ...meta } = metadata as KObj['metadata'] & { managedFields?: unknown };
      (stored.metadata as { managedFields?: unknown }).managedFields = [
        { manager: 'sandpod', operation: 'Update', apiVersion: (rest as { apiVersion?: string }).apiVersion ?? 'v1', time: kubeTime(), fieldsType: 'FieldsV1', fieldsV1: fieldsV1({ metadata: meta, ...rest }) },
      ];
    }
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
    if (kind === 'pods') this.endFollows(ns, name);
    this.rv++;
    const gone = { ...obj, metadata: { ...obj.metadata, resourceVersion: String(this.rv) } };
    this.emit(kind, 'DELETED', gone);
    return gone;
  }

  private emit(kind: Kind, type: WatchEvent['type'], obj: KObj): void {
    const ev: WatchEvent = { rv: this.rv, kind, type, obj };
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
    // Ended by the server (its timeoutSeconds) while its 'close' has not come yet: a client that reads
    // nothing (a stopped process) keeps the response unfinished. A real server drops such a watch.
    if (w.res.writableEnded) {
      this.watchers.delete(w);
      return;
    }
    if (w.stalled) w.stalled.push(line);
    else if (this.held) this.held.set(w, [...(this.held.get(w) ?? []), line]);
    else w.res.write(line);
  }

  /** Every object of a kind (copies). */
  list(kind: Kind, ns?: string): KObj[] {
    return [...this.store.get(kind)!.values()].filter((o) => ns === undefined || o.metadata.namespace === ns).map(clone);
  }

  /**
   * Every stored object of a kind, not copied: for drivers that scan often (the in-flight bench),
   * where copying every object each time would make the fake, not the service, the bottleneck.
   * Read only.
   */
  peek(kind: Kind): readonly Readonly<KObj>[] {
    return [...this.store.get(kind)!.values()];
  }

  /** One object (a copy), or undefined. */
  get(kind: Kind, ns: string | undefined, name: string): KObj | undefined {
    const o = this.stored(kind, ns, name);
    return o ? clone(o) : undefined;
  }

  /** One stored object, not copied (read only): for the fake's own lookups on every exec and pod update. */
  private stored(kind: Kind, ns: string | undefined, name: string): Readonly<KObj> | undefined {
    return this.store.get(kind)!.get(this.key(ns, name));
  }

  // ---------------------------------------------------------------- control: cluster

  /** Forgets the watch history: a watch from any earlier resourceVersion gets 410 Gone. */
  compact(): void {
    this.history = [];
    this.oldestRv = this.rv;
  }

  /** Closes every open watch from the server side (like an API server restart or timeout). */
  closeWatches(): void {
    for (const w of this.watchers) {
      if (w.timer) clearTimeout(w.timer);
      w.res.end();
    }
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
    for (const [w, lines] of held ?? []) if (this.watchers.has(w) && !w.res.writableEnded) w.res.write(lines.join(''));
  }

  /** Whether the process the fake runs for a pod's `main` or `collector` is alive (runWarmPods). */
  processAlive(podName: string, container: 'main' | 'collector'): boolean {
    return (container === 'main' ? this.procs : this.delivers).has(podName);
  }

  /** Number of open watches. */
  get openWatches(): number {
    return this.watchers.size;
  }

  /**
   * The server hangs for matching requests until {@link clearHang}: see the module comment. Open
   * watches that match stall at once. Hangs add up; `clearHang` ends them all.
   */
  hang(opts: HangOptions = {}): void {
    this.hangs.push(opts);
    if (opts.only === 'requests') return;
    for (const w of this.watchers) if (!w.stalled && this.hangs.some((h) => hangMatches(h, watchPath(w), 'GET', true))) w.stalled = [];
  }

  /** Ends every hang: held requests are served (if their client waits), stalled watches resume. */
  clearHang(): void {
    this.hangs.length = 0;
    for (const h of this.heldRequests.splice(0)) if (!h.gone()) h.run();
    for (const w of this.watchers) {
      if (!w.stalled) continue;
      const lines = w.stalled;
      w.stalled = null;
      if (lines.length > 0) w.res.write(lines.join(''));
      // A watch whose timeoutSeconds passed while the server hung is closed now, as it would have been.
      this.armWatchTimeout(w);
    }
  }

  /** Requests held by a hang right now. */
  get hungRequests(): number {
    return this.heldRequests.filter((h) => !h.gone()).length;
  }

  /** Open watches that are stalled (silent) right now. */
  get stalledWatches(): number {
    return [...this.watchers].filter((w) => w.stalled).length;
  }

  private hangFor(pathname: string, method: string, watch: boolean): HangOptions | undefined {
    return this.hangs.find((h) => hangMatches(h, pathname, method, watch));
  }

  private armWatchTimeout(w: Watcher): void {
    if (w.timer) clearTimeout(w.timer);
    w.timer = setTimeout(() => {
      w.timer = null;
      // A hung server closes nothing: the watch stays open until the hang ends.
      if (!w.stalled) {
        w.res.end();
        this.watchers.delete(w);
      }
    }, Math.max(0, w.closeAt - Date.now()));
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

  /** Creates or replaces a ClusterIP Service (the network check reads the service's own). */
  addService(namespace: string, name: string, clusterIP: string, port: number): KObj {
    return this.put('services', { metadata: { name, namespace }, spec: { type: 'ClusterIP', clusterIP, ports: [{ name: 'http', port, protocol: 'TCP' }] } });
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

  /**
   * Waits until a condition over the fake's state holds. A wait, not a bound: the default is generous
   * (the suite shares two cores with real sandboxes; a test that means a time limit says it).
   */
  async waitFor(cond: () => boolean, timeoutMs = 15_000, what = 'condition'): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (!cond()) {
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  private findPod(name: string): KObj {
    // One copy, of the pod asked for: copying every pod per update made each update O(pods).
    for (const p of this.store.get('pods')!.values()) if (p.metadata.name === name) return clone(p);
    throw new Error(`fake: no pod ${name}`);
  }

  /** Applies a change to a pod's status (and recomputes its phase), emitting MODIFIED. */
  updatePod(name: string, mutate: (pod: KObj) => void, recompute = true): KObj {
    const pod = this.findPod(name);
    mutate(pod);
    if (recompute) pod.status.phase = podPhase(pod);
    const stored = this.put('pods', pod, true, true);
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
    if ((state as { terminated?: unknown }).terminated) setImmediate(() => this.endFollows(pod.metadata.namespace, pod.metadata.name, container));
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

  /** The OOM killer took `main` of a pod whose runner runs here (runWarmPods): its runner killed, `main` OOMKilled (137). */
  oomKill(name: string): void {
    this.oomKilledPods.add(name);
    this.mainTerminated(name, 137, 'OOMKilled');
    this.procs.get(name)?.child.kill('SIGKILL');
  }

  /** Cuts every open attach to a pod (the container goes on; its stdin stays open unless `stdinOnce`). */
  dropAttaches(name: string): number {
    const open = [...(this.openAttaches.get(name) ?? [])];
    for (const ws of open) ws.terminate();
    return open.length;
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
    this.procs.get(name)?.child.kill('SIGKILL');
    this.delivers.get(name)?.child.kill('SIGKILL');
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
    const current = this.stored('jobs', pod.metadata.namespace, jobName);
    if (!current || current.status?.conditions?.some((c: { status: string }) => c.status === 'True')) return;
    if (pod.status.phase !== 'Succeeded' && pod.status.phase !== 'Failed') return;
    const job = clone(current) as KObj;
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
        qosClass: qosClassOf(tpl.spec),
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
    if (this.opts.runWarmPods && tpl.spec.containers.some((c: { name: string; stdin?: boolean }) => c.name === 'collector' && c.stdin)) {
      this.later(5 + this.podStartDelayMs, () => this.startWarmPod(pod.metadata.name));
    }
    job.status = { ...(job.status ?? {}), startTime: kubeTime(), active: 1 };
    this.put('jobs', job);
  }

  /** The collector exits 0 (its release file appeared). */
  private releaseCollector(pod: KObj): void {
    this.delivers.get(pod.metadata.name)?.child.kill('SIGTERM');
    this.updatePod(pod.metadata.name, (p) =>
      this.setContainer(p, 'collector', { terminated: { exitCode: 0, reason: 'Completed', startedAt: kubeTime(), finishedAt: kubeTime() } }),
    );
  }

  // ---------------------------------------------------------------- HTTP

  private async rawBody(req: http.IncomingMessage): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  private async body(req: http.IncomingMessage): Promise<any> {
    const text = (await this.rawBody(req)).toString('utf8');
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
      const hang = this.hangFor(url.pathname, method, watch);
      if (hang && (!watch || hang.watches === 'unanswered')) {
        // Accepted, never answered: the body is read (the server took it), nothing is carried out.
        const body = await this.rawBody(req);
        this.heldRequests.push({
          gone: () => res.destroyed || req.socket.destroyed,
          run: () => void this.serve(Object.assign(Readable.from(body.length ? [body] : []), { headers: req.headers }) as unknown as http.IncomingMessage, res, url, method, watch).catch((err) => this.json(res, 500, status(500, 'InternalError', String(err)))),
        });
        return;
      }
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
    if (sub === 'log' && method === 'GET') return this.podLog(req, res, ns!, name!, url);
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
      if (method === 'PATCH' && sub === 'status') return this.patchStatus(req, res, kind, ns, name);
      if (method === 'PUT') return this.replace(res, kind, ns, name, await this.body(req));
      if (method === 'PATCH') return this.patch(res, kind, ns, name, req.headers['content-type'] ?? '', await this.body(req));
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
    // Without timeoutSeconds a real API server picks a random time in [min-request-timeout, 2×) (30 min).
    const timeout = Number(url.searchParams.get('timeoutSeconds') ?? 0) || 1800 * (1 + Math.random());
    const w: Watcher = {
      kind,
      ns: ns ?? null,
      selector: parseSelector(url.searchParams.get('labelSelector')),
      res,
      bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true',
      stalled: this.hangFor(url.pathname, 'GET', true) ? [] : null,
      closeAt: Date.now() + timeout * 1000,
      timer: null,
    };
    for (const ev of this.history) if (ev.rv > fromRv) this.send(w, ev);
    this.watchers.add(w);
    this.armWatchTimeout(w);
    const bookmark = w.bookmarks
      ? setInterval(() => {
          // The watch may have ended (its timeout) before 'close' cleared this timer.
          if (w.stalled || res.writableEnded) return;
          res.write(JSON.stringify({ type: 'BOOKMARK', object: { kind: KIND_META[kind].kind, apiVersion: KIND_META[kind].apiVersion, metadata: { resourceVersion: String(this.rv) } } }) + '\n');
        }, 1000)
      : null;
    const cleanup = () => {
      if (w.timer) clearTimeout(w.timer);
      if (bookmark) clearInterval(bookmark);
      this.watchers.delete(w);
    };
    res.on('close', cleanup);
    req.on('close', cleanup);
  }

  private create(res: http.ServerResponse, kind: Kind, ns: string | undefined, body: any): void {
    if (kind === 'leases' && !microTimesValid(body)) return this.json(res, 400, status(400, 'BadRequest', MICRO_TIME_ERROR));
    const name = body?.metadata?.name;
    if (!name) return this.json(res, 422, status(422, 'Invalid', 'metadata.name: Required value'));
    if (this.store.get(kind)!.has(this.key(ns, name))) return this.json(res, 409, status(409, 'AlreadyExists', `${kind} "${name}" already exists`, { name, kind }));
    const obj = this.put(kind, { ...body, metadata: { ...body.metadata, namespace: ns } });
    this.json(res, 201, obj);
    if (kind === 'jobs' && this.opts.jobCreatesPod !== false) setImmediate(() => {
        const job = this.get('jobs', ns, name);
        if (job) this.createPodForJob(job);
      });
  }

  /** PUT: optimistic concurrency on `metadata.resourceVersion`; status and identity are the server's. */
  private replace(res: http.ServerResponse, kind: Kind, ns: string | undefined, name: string, body: any): void {
    if (kind === 'leases' && !microTimesValid(body)) return this.json(res, 400, status(400, 'BadRequest', MICRO_TIME_ERROR));
    const current = this.get(kind, ns, name);
    if (!current) return this.json(res, 404, notFound(kind, name));
    const rv = body?.metadata?.resourceVersion;
    if (rv !== undefined && rv !== current.metadata.resourceVersion) {
      return this.json(res, 409, status(409, 'Conflict', `Operation cannot be fulfilled on ${kind} "${name}": the object has been modified; please apply your changes to the latest version and try again`, { name, kind }));
    }
    if (kind === 'jobs' && JSON.stringify(body?.spec?.template) !== JSON.stringify(current.spec?.template)) {
      return this.json(res, 422, status(422, 'Invalid', `Job.batch "${name}" is invalid: spec.template: Invalid value: field is immutable`));
    }
    const stored = this.put(kind, { ...body, metadata: { ...body.metadata, name, namespace: ns, uid: current.metadata.uid, creationTimestamp: current.metadata.creationTimestamp }, status: current.status });
    this.json(res, 200, stored);
  }

  /** PATCH with a JSON patch (the client's default); add/replace/remove on object paths. */
  private patch(res: http.ServerResponse, kind: Kind, ns: string | undefined, name: string, contentType: string, ops: any): void {
    const current = this.get(kind, ns, name);
    if (!current) return this.json(res, 404, notFound(kind, name));
    if (!contentType.includes('json-patch') || !Array.isArray(ops)) return this.json(res, 415, status(415, 'UnsupportedMediaType', `the fake takes JSON patches only (${contentType})`));
    const readVersion = current.metadata.resourceVersion;
    for (const op of ops as { op: string; path: string; value?: unknown }[]) {
      const parts = op.path.split('/').slice(1).map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
      const last = parts.pop()!;
      let target: any = current;
      for (const p of parts) {
        target = target?.[p];
        if (target === undefined || target === null) return this.json(res, 422, status(422, 'Invalid', `patch path ${op.path} does not exist`));
      }
      if (op.op === 'add' || op.op === 'replace') target[last] = op.value;
      else if (op.op === 'remove') delete target[last];
      else return this.json(res, 422, status(422, 'Invalid', `unsupported patch op ${op.op}`));
    }
    // A patch that sets `metadata.resourceVersion` makes it a precondition, as the API server does.
    if (current.metadata.resourceVersion !== readVersion) {
      return this.json(res, 409, status(409, 'Conflict', `Operation cannot be fulfilled on ${kind} "${name}": the object has been modified; please apply your changes to the latest version and try again`, { name, kind }));
    }
    const stored = this.put(kind, current);
    this.json(res, 200, stored);
  }

  private deleteHandler(res: http.ServerResponse, kind: Kind, ns: string | undefined, name: string, url: URL, body: any): void {
    const obj = this.get(kind, ns, name);
    if (!obj) return this.json(res, 404, notFound(kind, name));
    const pre = body?.preconditions as { uid?: string; resourceVersion?: string } | undefined;
    if ((pre?.resourceVersion && pre.resourceVersion !== obj.metadata.resourceVersion) || (pre?.uid && pre.uid !== obj.metadata.uid)) {
      return this.json(res, 409, status(409, 'Conflict', `Operation cannot be fulfilled on ${kind} "${name}": Precondition failed`, { name, kind }));
    }
    const policy: string = body?.propagationPolicy ?? url.searchParams.get('propagationPolicy') ?? (kind === 'jobs' ? 'Orphan' : 'Background');
    const graceRaw = body?.gracePeriodSeconds ?? url.searchParams.get('gracePeriodSeconds');
    const grace = graceRaw === null || graceRaw === undefined ? undefined : Number(graceRaw);
    if (kind === 'pods') {
      this.deletePodObject(obj, grace);
      return this.json(res, 200, obj);
    }
    const dependents = (k: Kind) => this.peek(k).filter((o) => o.metadata.namespace === ns && o.metadata.ownerReferences?.some((r) => r.uid === obj.metadata.uid)).map(clone);
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

  /**
   * PATCH of a status subresource as a JSON patch (`application/json-patch+json`, what client-node
   * sends): only operations on `/status` are applied, as the API server keeps nothing else of it.
   */
  private async patchStatus(req: http.IncomingMessage, res: http.ServerResponse, kind: Kind, ns: string | undefined, name: string): Promise<void> {
    const obj = this.get(kind, ns, name);
    if (!obj) return this.json(res, 404, notFound(kind, name));
    if (!String(req.headers['content-type'] ?? '').startsWith('application/json-patch+json')) {
      return this.json(res, 415, status(415, 'UnsupportedMediaType', `the fake takes JSON patches only, got ${String(req.headers['content-type'])}`));
    }
    const ops = (await this.body(req)) as { op: string; path: string; value?: unknown }[];
    for (const op of ops) {
      if ((op.op === 'add' || op.op === 'replace') && op.path === '/status') obj.status = clone(op.value);
      else return this.json(res, 422, status(422, 'Invalid', `the fake applies add/replace of /status only, got ${op.op} ${op.path}`));
    }
    this.json(res, 200, this.put(kind, obj));
  }

  /**
   * `GET .../log` as a real API server answers it: 400 while the container is waiting to start; the
   * log so far (at most `limitBytes`); with `follow=true`, the response stays open and carries what the
   * container writes next, and ends when the container ends (or the pod goes, or `limitBytes` is reached).
   */
  private podLog(req: http.IncomingMessage, res: http.ServerResponse, ns: string, name: string, url: URL): void {
    const container = url.searchParams.get('container') ?? '';
    const pod = this.get('pods', ns, name);
    if (!pod) return this.json(res, 404, notFound('pods', name));
    const st = [...(pod.status?.initContainerStatuses ?? []), ...(pod.status?.containerStatuses ?? [])].find((c: { name: string }) => c.name === container);
    if (st?.state?.waiting) {
      return this.json(res, 400, status(400, 'BadRequest', `container "${container}" in pod "${name}" is waiting to start: ${st.state.waiting.reason ?? 'ContainerCreating'}`));
    }
    const key = `${ns}/${name}/${container}`;
    const limitRaw = url.searchParams.get('limitBytes');
    let left = limitRaw ? Number(limitRaw) : Infinity;
    const text = this.logs.get(key) ?? Buffer.alloc(0);
    const first = text.subarray(0, Math.min(text.length, left));
    left -= first.length;
    const follow = url.searchParams.get('follow') === 'true';
    res.writeHead(200, { 'content-type': 'text/plain', ...(follow ? { 'transfer-encoding': 'chunked' } : {}) });
    if (!follow || st?.state?.terminated || left <= 0) {
      res.end(first);
      return;
    }
    if (first.length > 0) res.write(first);
    else res.flushHeaders();
    const f = { res, left };
    let set = this.logFollowers.get(key);
    if (!set) this.logFollowers.set(key, (set = new Set()));
    set.add(f);
    const drop = () => set.delete(f);
    res.on('close', drop);
    req.on('close', drop);
  }

  /** Sets what `GET .../log?container=` returns for a pod's container (replaces what was there). */
  setLog(podName: string, container: string, text: string): void {
    const pod = this.findPod(podName);
    this.logs.set(`${pod.metadata.namespace}/${podName}/${container}`, Buffer.from(text));
  }

  /** What a container wrote to its log so far (`kubectl logs`). */
  logOf(podName: string, container: string): string {
    const pod = this.findPod(podName);
    return (this.logs.get(`${pod.metadata.namespace}/${podName}/${container}`) ?? Buffer.alloc(0)).toString('utf8');
  }

  /** The container writes to its log: kept, and sent at once to every follow of it. */
  appendLog(podName: string, container: string, data: string | Buffer): void {
    const pod = this.findPod(podName);
    const key = `${pod.metadata.namespace}/${podName}/${container}`;
    const bytes = typeof data === 'string' ? Buffer.from(data) : data;
    this.logs.set(key, Buffer.concat([this.logs.get(key) ?? Buffer.alloc(0), bytes]));
    for (const f of [...(this.logFollowers.get(key) ?? [])]) {
      const part = bytes.subarray(0, Math.min(bytes.length, f.left));
      f.left -= part.length;
      if (part.length > 0) f.res.write(part);
      if (f.left <= 0) this.endFollow(key, f);
    }
  }

  /** Open log follows (for tests). */
  get openLogFollows(): number {
    let n = 0;
    for (const set of this.logFollowers.values()) n += set.size;
    return n;
  }

  private endFollow(key: string, f: { res: http.ServerResponse; left: number }): void {
    this.logFollowers.get(key)?.delete(f);
    f.res.end();
  }

  /** The container ended (or its pod went): its follows end, as the kubelet closes the log. */
  private endFollows(ns: string | undefined, podName: string, container?: string): void {
    for (const [key, set] of this.logFollowers) {
      if (!key.startsWith(`${ns}/${podName}/`) || (container !== undefined && key !== `${ns}/${podName}/${container}`)) continue;
      for (const f of [...set]) this.endFollow(key, f);
    }
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
    if (this.hangFor(url.pathname, req.method ?? 'GET', false)) {
      // The upgrade is accepted and never answered; carried out when the hang ends, if still wanted.
      this.heldRequests.push({ gone: () => socket.destroyed, run: () => this.upgradeNow(req, socket, head, url, refuse) });
      return;
    }
    this.upgradeNow(req, socket, head, url, refuse);
  }

  private upgradeNow(req: http.IncomingMessage, socket: Socket, head: Buffer, url: URL, refuse: (code: number, body: object) => void): void {
    const a = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/attach$/.exec(url.pathname);
    if (a) return this.attachNow(req, socket, head, url, a[1]!, a[2]!, refuse);
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)\/exec$/.exec(url.pathname);
    if (!m) return refuse(404, status(404, 'NotFound', 'not an exec path'));
    const [, ns, podName] = m as unknown as [string, string, string];
    const pod = this.stored('pods', ns, podName);
    if (!pod) return refuse(404, notFound('pods', podName));
    const container = url.searchParams.get('container') ?? pod.spec.containers[0].name;
    const cs = (pod.status.containerStatuses ?? []).find((c: { name: string }) => c.name === container);
    if (!cs) return refuse(400, status(400, 'BadRequest', `container ${container} is not valid for pod ${podName}`));
    // Like the kubelet, which asks the container runtime: a started container counts, whatever the
    // status says yet (statusLagMs), until it is reported ended.
    const started = this.startedPods.has(podName) && !cs.state?.terminated;
    if (!cs.state?.running && !started) {
      this.execRefusals++;
      // The kubelet's answer (kcluster, 1.20) for a container the runtime has not started.
      return refuse(500, status(500, 'InternalError', `container not found ("${container}")`));
    }
    const command = url.searchParams.getAll('command');
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      const call: ExecCall = { namespace: ns, pod: podName, container, command, protocol: ws.protocol };
      this.execs.push(call);
      void this.runExec(ws, call, pod);
    });
  }

  private attachNow(req: http.IncomingMessage, socket: Socket, head: Buffer, url: URL, ns: string, podName: string, refuse: (code: number, body: object) => void): void {
    const pod = this.stored('pods', ns, podName);
    if (!pod) return refuse(404, notFound('pods', podName));
    const container = url.searchParams.get('container') ?? pod.spec.containers[0].name;
    const spec = (pod.spec.containers as { name: string; stdin?: boolean }[]).find((c) => c.name === container);
    const cs = (pod.status.containerStatuses ?? []).find((c: { name: string }) => c.name === container);
    if (!spec || !cs) return refuse(400, status(400, 'BadRequest', `container ${container} is not valid for pod ${podName}`));
    // Like the container runtime, which attach asks: a started process counts, whatever the status says.
    const table = container === 'main' ? this.procs : container === 'collector' ? this.delivers : null;
    const started = !!table?.has(podName);
    // A container whose process the fake ran and that has ended is not running, whatever its status
    // says yet (the kubelet reports an end late; the container runtime, which attach asks, knows).
    const ended = this.startedPods.has(podName) && !!table && !started;
    if ((!cs.state?.running && !started) || ended) {
      this.attachRefusals++;
      // The kubelet's answer (kcluster, 1.20) for a container the runtime has not running.
      return refuse(500, status(500, 'InternalError', `container ${container} not found in pod ${podName}_${ns}`));
    }
    if (url.searchParams.get('stdin') === 'true' && !spec.stdin) return refuse(400, status(400, 'BadRequest', `stdin is not enabled for container ${container}`));
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      const call: AttachCall = { namespace: ns, pod: podName, container, protocol: ws.protocol, stdin: [], ended: false };
      this.attaches.push(call);
      const open = this.openAttaches.get(podName) ?? new Set<WebSocket>();
      this.openAttaches.set(podName, open.add(ws));
      ws.on('close', () => open.delete(ws));
      const proc = table?.get(podName);
      const frame = (channel: number, data: Buffer) => {
        if (ws.readyState === ws.OPEN) ws.send(Buffer.concat([Buffer.from([channel]), data]));
      };
      for (const channel of [1, 3]) frame(channel, Buffer.alloc(0));
      const sink = (b: Buffer) => frame(1, b);
      proc?.sinks.add(sink);
      const firstAttach = proc ? !proc.attached : false;
      if (proc) proc.attached = true;
      const drop = container === 'collector' && this.attachDropsBeforeStdin > 0;
      if (drop) this.attachDropsBeforeStdin--;
      ws.on('message', (data: Buffer) => {
        if (drop) {
          ws.terminate();
          return;
        }
        if (data.length > 1 && data[0] === 0) {
          call.stdin.push(Buffer.from(data.subarray(1)));
          proc?.child.stdin?.write(data.subarray(1));
        }
      });
      ws.on('close', () => {
        call.ended = true;
        proc?.sinks.delete(sink);
        // stdinOnce: the first attach's end closes the container's stdin for good.
        if (firstAttach && spec && (spec as { stdinOnce?: boolean }).stdinOnce) proc?.child.stdin?.end();
      });
      const ended = () => {
        frame(3, Buffer.from(JSON.stringify({ metadata: {}, status: 'Success' })));
        ws.close(1000);
      };
      // The process may have ended during the upgrade (after the check above): the stream ends at once.
      if (started && (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null)) ended();
      else proc?.child.once('exit', ended);
    });
  }

  /** runWarmPods: the pod starts and `main` runs the real runner of its command (module comment). */
  private startWarmPod(podName: string): void {
    const pod = this.get('pods', undefined, podName) ?? this.list('pods').find((p) => p.metadata.name === podName);
    if (!pod || pod.metadata.deletionTimestamp) return;
    const bad = (pod.spec.containers as { name: string; image: string }[]).find((c) => this.unpullable.has(c.image));
    if (bad) {
      const msg = `rpc error: code = NotFound desc = failed to pull and unpack image "${bad.image}": not found`;
      this.waiting(podName, bad.name, 'ErrImagePull', msg);
      this.later(20, () => {
        if (this.peek('pods').some((p) => p.metadata.name === podName && !p.metadata.deletionTimestamp)) this.waiting(podName, bad.name, 'ImagePullBackOff', `Back-off pulling image "${bad.image}"`);
      });
      return;
    }
    const containers = pod.spec.containers as { name: string; command?: string[] }[];
    const main = containers.find((c) => c.name === 'main');
    const collector = containers.find((c) => c.name === 'collector');
    if (!main?.command || !collector?.command) return;
    const base = path.join(this.root, podName);
    // ConfigMap volumes (the runner sources): the kubelet mounts nothing, and starts nothing, until
    // the ConfigMap exists (FailedMount, tried again); then its keys are read-only files.
    const mounted: Record<string, string> = {};
    for (const v of (pod.spec.volumes ?? []) as { name: string; configMap?: { name: string } }[]) {
      if (!v.configMap) continue;
      const cm = this.get('configmaps', pod.metadata.namespace, v.configMap.name);
      if (!cm) {
        this.later(100, () => this.startWarmPod(podName));
        return;
      }
      const dir = path.join(base, `configmap-${v.name}`);
      mkdirSync(dir, { recursive: true });
      for (const [key, text] of Object.entries((cm.data ?? {}) as Record<string, string>)) writeFileSync(path.join(dir, key), text, { mode: 0o444 });
      for (const c of containers) for (const m of (c as { volumeMounts?: { name: string; mountPath: string }[] }).volumeMounts ?? []) if (m.name === v.name) mounted[m.mountPath] = dir;
    }
    const dirs: Record<string, string> = {
      ...mounted,
      '/code': path.join(base, 'code'),
      '/input': path.join(base, 'input'),
      '/output': this.outputDir(podName),
      '/tmp': path.join(base, 'tmp'),
      '/control': path.join(base, 'control'),
      '/workspace': path.join(base, 'workspace'),
    };
    for (const d of Object.values(dirs)) mkdirSync(d, { recursive: true });
    const mapPath = (a: string) => {
      for (const [from, to] of Object.entries(dirs)) if (a === from || a.startsWith(from + '/')) return to + a.slice(from.length);
      return a;
    };
    // Every pod of the fake shares the host's loopback: each gets its own go port, and its own port
    // for what main's startup probe connects to.
    const busy = localPortsInUse(); // read once for both of the pod's ports
    const port = this.takeGoPort(busy);
    const probe = (main as { startupProbe?: { tcpSocket?: { port?: number | string } } }).startupProbe?.tcpSocket;
    const probePort = probe ? this.takeGoPort(busy) : 0;
    const podIP = '127.0.0.1';
    this.updatePod(podName, (p) => {
      p.status.podIP ??= podIP;
      p.status.podIPs ??= [{ ip: p.status.podIP }];
    });
    // The kubelet's expansion of `$(VAR)` in a container's command: from its env (literal values and
    // the pod IP by fieldRef); `$$` is a literal `$`; an unknown reference stays as written.
    const vars = new Map<string, string>();
    for (const e of (main as { env?: { name: string; value?: string; valueFrom?: { fieldRef?: { fieldPath?: string } } }[] }).env ?? []) {
      if (e.value !== undefined) vars.set(e.name, e.value);
      else if (e.valueFrom?.fieldRef?.fieldPath === 'status.podIP') vars.set(e.name, podIP);
    }
    const expand = (a: string) => a.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m, name: string | undefined) => (name === undefined ? '$' : (vars.get(name) ?? m)));
    const argsOf = (command: string[], own: boolean) => {
      const py = command.indexOf('python3');
      const ported = (a: string) => (probe && a.endsWith(`:${String(probe.port)}`) ? `${a.slice(0, a.lastIndexOf(':'))}:${probePort}` : a);
      const args = (own ? command.map(expand) : command)
        .slice(py + 1)
        .map((a, i, all) => (all[i - 1] === '-c' ? a : all[i - 1] === '--go-port' ? String(port) : all[i - 1] === '--ready-listen' ? ported(a) : mapPath(a)));
      // Without --rlimit (the fake runs as whoever runs the tests; an fsize limit would also apply to its writes).
      const clean: string[] = [];
      for (let i = 0; i < args.length; i++) {
        if (args[i] === '--rlimit') i++;
        else clean.push(args[i]!);
      }
      return clean;
    };
    const env = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: dirs['/tmp']!, TMPDIR: dirs['/tmp']!, LANG: 'C.UTF-8' };
    // A slow start of main's runner (a loaded node): its process starts only after the delay.
    const delay = this.mainStartDelayMs;
    const child = delay > 0 ? spawn('sh', ['-c', `sleep ${delay / 1000}; exec python3 "$@"`, 'sh', ...argsOf(main.command, true)], { env, stdio: ['ignore', 'pipe', 'pipe'] }) : spawn('python3', argsOf(main.command, true), { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const entry = { child, sinks: new Set<(b: Buffer) => void>(), attached: false };
    this.procs.set(podName, entry);
    this.startedPods.add(podName);
    // main's stdout and stderr are its container log (with --tee: the program's output).
    const toLog = (b: Buffer) => {
      if (this.peek('pods').some((p) => p.metadata.name === podName)) this.appendLog(podName, 'main', b);
    };
    child.stdout!.on('data', toLog);
    child.stderr!.on('data', toLog);
    child.on('exit', (code, signal) => {
      this.procs.delete(podName);
      if (!this.get('pods', pod.metadata.namespace, podName) || this.oomKilledPods.has(podName)) return;
      this.mainTerminated(podName, code ?? (signal ? 137 : 1));
    });
    const deliver = spawn('python3', argsOf(collector.command, false), { env, stdio: ['pipe', 'pipe', 'ignore'] });
    const dEntry = { child: deliver, sinks: new Set<(b: Buffer) => void>(), attached: false };
    this.delivers.set(podName, dEntry);
    deliver.stdout!.on('data', (b: Buffer) => {
      for (const sink of dEntry.sinks) sink(b);
      if (this.peek('pods').some((p) => p.metadata.name === podName)) this.appendLog(podName, 'collector', b);
    });
    deliver.stdin!.on('error', () => undefined);
    const jobName = pod.metadata.labels?.['job-name'] as string | undefined;
    if (jobName && this.collectorStdinClosedJobs.delete(jobName)) deliver.stdin!.end();
    deliver.on('exit', (code) => {
      this.delivers.delete(podName);
      // Exited by itself with a failure (not stopped by us: that is a signal): the container ended,
      // as the kubelet reports it, after its start was (the status lag).
      if (code === null || code === 0) return;
      this.later(this.statusLagMs + this.collectorEndLagMs + 1, () => {
        if (!this.peek('pods').some((p) => p.metadata.name === podName && !p.metadata.deletionTimestamp)) return;
        this.updatePod(podName, (p) => this.setContainer(p, 'collector', { terminated: { exitCode: code, reason: 'Error', startedAt: kubeTime(), finishedAt: kubeTime() } }, { started: false, ready: false }));
      });
    });
    // The kubelet reports a started container at its next status sync; the runtime (attach) knows at once.
    if (this.statusLagMs > 0) {
      this.later(this.statusLagMs, () => {
        if (!this.peek('pods').some((p) => p.metadata.name === podName && !p.metadata.deletionTimestamp)) return;
        if (this.procs.has(podName)) this.mainRunning(podName);
        // main ended within the lag (its end is reported already): the collector's start still is.
        else this.updatePod(podName, (p) => this.setContainer(p, 'collector', { running: { startedAt: kubeTime() } }, { started: true, ready: true }));
        if (probe) this.runStartupProbe(podName, probePort);
      });
    } else {
      this.mainRunning(podName);
      if (probe) this.runStartupProbe(podName, probePort);
    }
  }

  /**
   * `main`'s `tcpSocket` startup probe, as the kubelet runs it: not started and not ready until a
   * connection to `port` succeeds (then started, ready after probeReadyLagMs, and the probe stops);
   * tried every probePeriodMs while main runs.
   */
  private runStartupProbe(podName: string, port: number): void {
    const mainOf = (p: KObj | undefined) => p?.status?.containerStatuses?.find((c: { name: string }) => c.name === 'main');
    const running = () => !!mainOf(this.peek('pods').find((p) => p.metadata.name === podName))?.state?.running;
    if (!running()) return;
    this.updatePod(podName, (p) => Object.assign(mainOf(p) ?? {}, { started: false, ready: false }));
    const attempt = () => {
      if (!running() || !this.procs.has(podName)) return;
      const sock = net.connect({ host: '127.0.0.1', port });
      sock.once('connect', () => {
        sock.destroy();
        this.probeConnects++;
        if (!running()) return;
        // `started` at once; `ready` at the kubelet's next sync of the pod (probeReadyLagMs).
        const lag = this.probeReadyLagMs;
        this.updatePod(podName, (p) => Object.assign(mainOf(p) ?? {}, { started: true, ready: lag <= 0 }));
        if (lag > 0) this.later(lag, () => running() && this.updatePod(podName, (p) => Object.assign(mainOf(p) ?? {}, { ready: true })));
      });
      sock.once('error', () => {
        sock.destroy();
        this.later(this.opts.probePeriodMs ?? 25, attempt);
      });
    };
    attempt();
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
    } else if (cmd.includes('/control/claim')) {
      // The fence of a run's new holder, run for real on the pod's /control (which a real collector,
      // deliver.py, shares when the fake runs the pod's processes).
      const dir = path.join(this.root, call.pod, 'control');
      mkdirSync(dir, { recursive: true });
      const child = spawn(call.command[0]!, call.command.slice(1).map((a) => a.replaceAll('/control/claim', path.join(dir, 'claim'))), { stdio: ['ignore', 'ignore', 'pipe'] });
      child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
      exitCode = await new Promise<number>((resolve) => {
        child.on('error', () => resolve(127));
        child.on('close', (code) => resolve(code ?? 1));
      });
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

function hangMatches(h: HangOptions, pathname: string, method: string, watch: boolean): boolean {
  if (h.only === 'watches' && !watch) return false;
  if (h.only === 'requests' && watch) return false;
  if (h.method && h.method !== method) return false;
  return !h.path || h.path.test(pathname);
}

/** The collection path a watcher watches (for matching hangs against open watches). */
function watchPath(w: Watcher): string {
  const meta = KIND_META[w.kind];
  const group = meta.apiVersion.includes('/') ? `/apis/${meta.apiVersion}` : `/api/${meta.apiVersion}`;
  return w.ns !== null && w.kind !== 'runtimeclasses' && w.kind !== 'namespaces' ? `${group}/namespaces/${w.ns}/${w.kind}` : `${group}/${w.kind}`;
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

/**
 * A Lease's acquireTime/renewTime are MicroTime: the real API server parses them with Go's RFC3339Micro
 * layout, which takes exactly six fractional digits ("…05.123456Z"); a plain ISO string with
 * milliseconds is refused with 400.
 */
const MICRO_TIME_ERROR = 'Lease in version "v1" cannot be handled as a Lease: parsing time as "2006-01-02T15:04:05.000000Z07:00"';
function microTimesValid(body: any): boolean {
  for (const f of ['acquireTime', 'renewTime']) {
    const v = body?.spec?.[f];
    if (v !== undefined && v !== null && !(typeof v === 'string' && /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$/.test(v))) return false;
  }
  return true;
}

function route(path: string): { kind: Kind; ns?: string; name?: string; sub?: string } | null {
  let m = /^\/api\/v1\/namespaces\/([^/]+)\/(pods|secrets|configmaps|services)(?:\/([^/]+))?(?:\/(log|exec|attach))?$/.exec(path);
  if (m) return { kind: m[2] as Kind, ns: m[1]!, ...(m[3] ? { name: m[3] } : {}), ...(m[4] ? { sub: m[4] } : {}) };
  m = /^\/apis\/batch\/v1\/namespaces\/([^/]+)\/jobs(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'jobs', ns: m[1]!, ...(m[2] ? { name: m[2] } : {}) };
  m = /^\/apis\/node\.k8s\.io\/v1\/runtimeclasses(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'runtimeclasses', ...(m[1] ? { name: m[1] } : {}) };
  m = /^\/apis\/sandpod\.io\/v1alpha1\/namespaces\/([^/]+)\/jobtypes(?:\/([^/]+))?(?:\/(status))?$/.exec(path);
  if (m) return { kind: 'jobtypes', ns: m[1]!, ...(m[2] ? { name: m[2] } : {}), ...(m[3] ? { sub: m[3] } : {}) };
  m = /^\/apis\/coordination\.k8s\.io\/v1\/namespaces\/([^/]+)\/leases(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'leases', ns: m[1]!, ...(m[2] ? { name: m[2] } : {}) };
  m = /^\/api\/v1\/namespaces(?:\/([^/]+))?$/.exec(path);
  if (m) return { kind: 'namespaces', ...(m[1] ? { name: m[1] } : {}) };
  return null;
}
