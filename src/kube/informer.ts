/**
 * A list+watch cache of one kind of object that survives what real API servers do to watches:
 * it re-lists on `410 Gone` (the resourceVersion it watched from was compacted away) and reconnects
 * with capped, jittered backoff on any other break, resuming from the last resourceVersion it saw.
 * A bare "restart the watch" is not enough: after a 410 the only way to learn what changed is a
 * fresh list, diffed against the cache, so deletions missed while disconnected still fire.
 *
 * Its list and watch calls never go through the service's circuit breaker: they are background
 * traffic with their own backoff, and a successful relist must not hide failing run calls.
 *
 * Hand-written rather than client-node's `makeInformer`: its ListWatch stops for good on any watch
 * error other than 410 and leaves reconnecting (and backing off) to the caller; this class is that
 * caller and the cache in one.
 */
import { Watch, type KubeConfig } from '@kubernetes/client-node';
import { silentLogger, type Logger } from '../logger.ts';

/** The part of a Kubernetes object the informer relies on. */
export interface KubeObject {
  metadata?: { name?: string; namespace?: string; resourceVersion?: string; uid?: string };
}

/** One page of a list call. */
export interface ListResult<T> {
  items: T[];
  resourceVersion: string;
}

/** Event kinds delivered to handlers. */
export type InformerEvent = 'add' | 'update' | 'delete';

/** Options of {@link ReconnectingInformer}. */
export interface InformerOptions<T> {
  kubeConfig: KubeConfig;
  /** Human name for logs, e.g. `pods`. */
  name: string;
  /** URL path of the collection, e.g. `/api/v1/namespaces/x/pods`. */
  path: string;
  labelSelector?: string;
  /** Lists the collection (a plain call; failures are retried here with backoff). */
  list: () => Promise<ListResult<T>>;
  logger?: Logger;
  /** First reconnect delay and cap, ms. */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** Server-side watch timeout; the server closes the watch after it and we resume. */
  watchTimeoutSeconds?: number;
}

/** Is this error (or watch ERROR Status) a `410 Gone`? */
export function isGone(err: unknown): boolean {
  const e = err as { statusCode?: number; code?: number } | null;
  return e?.statusCode === 410 || e?.code === 410;
}

/**
 * Keeps a cache of the objects matching `path` + `labelSelector` and calls handlers on every change.
 * `start()` resolves after the first successful list (the cache is synced).
 */
export class ReconnectingInformer<T extends KubeObject> {
  private readonly cache = new Map<string, T>();
  private readonly handlers: ((event: InformerEvent, obj: T, old?: T) => void)[] = [];
  private readonly log: Logger;
  private readonly watch: Watch;
  private resourceVersion = '';
  private stopped = true;
  private abort: AbortController | null = null;
  private failures = 0;
  private timer: NodeJS.Timeout | null = null;
  private syncedOnce = false;
  private firstSync: { resolve: () => void; reject: (e: unknown) => void } | null = null;
  /** Counts for health and tests. */
  readonly stats = { lists: 0, watches: 0, gone: 0, reconnects: 0 };

  constructor(private readonly opts: InformerOptions<T>) {
    this.log = opts.logger ?? silentLogger;
    this.watch = new Watch(opts.kubeConfig);
  }

  /** Registers a handler; it runs synchronously on each change, so it must only enqueue work. */
  on(handler: (event: InformerEvent, obj: T, old?: T) => void): void {
    this.handlers.push(handler);
  }

  /** The cached object of that name. */
  get(name: string): T | undefined {
    return this.cache.get(name);
  }

  /** Every cached object. */
  list(): T[] {
    return [...this.cache.values()];
  }

  /** True once a list has succeeded and the watch is (re)connecting from it. */
  get synced(): boolean {
    return this.syncedOnce;
  }

  /** Lists, then watches in the background. Rejects only when the first list fails. */
  start(): Promise<void> {
    if (!this.stopped) return Promise.resolve();
    this.stopped = false;
    return new Promise<void>((resolve, reject) => {
      this.firstSync = { resolve, reject };
      void this.relist();
    });
  }

  /** Stops watching; the cache keeps its last contents. */
  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.abort?.abort();
    this.abort = null;
  }

  private emit(event: InformerEvent, obj: T, old?: T): void {
    for (const h of this.handlers) {
      try {
        h(event, obj, old);
      } catch (err) {
        this.log.warn({ err, informer: this.opts.name }, 'informer handler threw');
      }
    }
  }

  private backoffMs(): number {
    const initial = this.opts.backoffInitialMs ?? 250;
    const max = this.opts.backoffMaxMs ?? 30_000;
    const exp = Math.min(max, initial * 2 ** Math.max(0, this.failures - 1));
    return Math.round(exp * (0.5 + Math.random() * 0.5));
  }

  private schedule(fn: () => void, ms: number): void {
    if (this.stopped) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = null;
      if (!this.stopped) fn();
    }, ms);
  }

  private async relist(): Promise<void> {
    if (this.stopped) return;
    this.stats.lists++;
    let res: ListResult<T>;
    try {
      res = await this.opts.list();
    } catch (err) {
      this.failures++;
      this.log.warn({ err: String(err), informer: this.opts.name }, 'list failed; retrying');
      if (this.firstSync && !this.syncedOnce) {
        // The first list's failure is the caller's to handle; later ones are retried quietly.
        const first = this.firstSync;
        this.firstSync = null;
        first.reject(err);
      }
      this.schedule(() => void this.relist(), this.backoffMs());
      return;
    }
    if (this.stopped) return;
    const fresh = new Map<string, T>();
    for (const item of res.items) {
      const n = item.metadata?.name;
      if (n) fresh.set(n, item);
    }
    for (const [n, old] of this.cache) {
      if (!fresh.has(n)) {
        this.cache.delete(n);
        this.emit('delete', old);
      }
    }
    for (const [n, obj] of fresh) {
      const old = this.cache.get(n);
      this.cache.set(n, obj);
      if (!old) this.emit('add', obj);
      else if (old.metadata?.resourceVersion !== obj.metadata?.resourceVersion) this.emit('update', obj, old);
    }
    this.resourceVersion = res.resourceVersion;
    this.syncedOnce = true;
    if (this.firstSync) {
      const first = this.firstSync;
      this.firstSync = null;
      first.resolve();
    }
    void this.startWatch();
  }

  private async startWatch(): Promise<void> {
    if (this.stopped) return;
    this.stats.watches++;
    const query: Record<string, string | number | boolean> = {
      resourceVersion: this.resourceVersion,
      allowWatchBookmarks: true,
      timeoutSeconds: this.opts.watchTimeoutSeconds ?? 300,
    };
    if (this.opts.labelSelector) query.labelSelector = this.opts.labelSelector;
    let gone = false;
    let ended = false;
    const startedAt = Date.now();
    const onEvent = (type: string, obj: unknown) => {
      if (ended || this.stopped) return;
      if (type === 'ERROR') {
        const status = obj as { code?: number; message?: string };
        if (status?.code === 410) gone = true;
        this.log.debug({ informer: this.opts.name, status }, 'watch error event');
        return;
      }
      const o = obj as T;
      const rv = o?.metadata?.resourceVersion;
      if (rv) this.resourceVersion = rv;
      if (type === 'BOOKMARK') return;
      const n = o?.metadata?.name;
      if (!n) return;
      this.failures = 0;
      const old = this.cache.get(n);
      if (type === 'DELETED') {
        this.cache.delete(n);
        this.emit('delete', o);
      } else if (type === 'ADDED' || type === 'MODIFIED') {
        this.cache.set(n, o);
        this.emit(old ? 'update' : 'add', o, old);
      }
    };
    const onDone = (err: unknown) => {
      if (ended) return;
      ended = true;
      if (this.stopped) return;
      if (gone || isGone(err)) {
        this.stats.gone++;
        this.log.debug({ informer: this.opts.name }, 'resourceVersion expired (410); re-listing');
        this.schedule(() => void this.relist(), 0);
        return;
      }
      if (err) {
        this.failures++;
        this.stats.reconnects++;
        this.log.warn({ err: String(err), informer: this.opts.name }, 'watch broke; reconnecting');
        this.schedule(() => void this.startWatch(), this.backoffMs());
      } else {
        // A clean end (server timeout or closed connection): resume at once from where we are,
        // but never hot-loop against a server that closes every watch immediately.
        this.stats.reconnects++;
        if (Date.now() - startedAt > 5000) this.failures = 0;
        this.schedule(() => void this.startWatch(), this.failures > 0 ? this.backoffMs() : 0);
        this.failures++;
      }
    };
    try {
      let established: AbortController | null = null;
      let failure: unknown = null;
      const ctrl = await this.watch.watch(this.opts.path, query, onEvent, (err: unknown) => {
        // An error before the watch was established is a failed connect, handled below.
        if (established === null && failure === null && err) failure = err;
        else onDone(err);
      });
      if (failure) throw failure;
      established = ctrl;
      if (this.stopped) ctrl.abort();
      else {
        this.abort = ctrl;
        // A connection that died without a FIN never ends by itself: past the server's own timeout
        // (plus slack), abort it so the done callback reconnects.
        const limitMs = ((this.opts.watchTimeoutSeconds ?? 300) + 30) * 1000;
        const watchdog = setTimeout(() => !ended && ctrl.abort(), limitMs);
        watchdog.unref();
        ctrl.signal.addEventListener('abort', () => clearTimeout(watchdog), { once: true });
      }
    } catch (err) {
      ended = true;
      if (isGone(err)) {
        this.stats.gone++;
        this.schedule(() => void this.relist(), 0);
        return;
      }
      this.failures++;
      this.stats.reconnects++;
      this.log.warn({ err: String(err), informer: this.opts.name }, 'watch could not connect; retrying');
      this.schedule(() => void this.startWatch(), this.backoffMs());
    }
  }
}
