/**
 * A list+watch cache of one kind of object that survives what real API servers do to watches:
 * it re-lists on `410 Gone` (the resourceVersion it watched from was compacted away) and reconnects
 * with capped, jittered backoff on any other break, resuming from the last resourceVersion it saw.
 * A hung API server is survived too: the list has the client's request deadline, and a watch that
 * gets no headers, or stays open silent past its `timeoutSeconds`, is given up (`watch.ts`) — a
 * stalled one followed by a fresh list.
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
import type { KubeConfig } from '@kubernetes/client-node';
import { silentLogger, type Logger } from '../logger.ts';
import { DEFAULT_REQUEST_TIMEOUT_MS } from './kube-api.ts';
import { openWatch, WatchStalledError, type WatchHandle } from './watch.ts';

/** Server-side timeout of each watch unless configured otherwise, s. */
export const DEFAULT_WATCH_TIMEOUT_SECONDS = 60;

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
  /**
   * Server-side watch timeout (`timeoutSeconds`, default {@link DEFAULT_WATCH_TIMEOUT_SECONDS}); the
   * server closes the watch after it and we resume. A watch still open well past it is stalled
   * ({@link watchDeadlineMs}): it is aborted and the collection re-listed.
   */
  watchTimeoutSeconds?: number;
  /** How long a watch may wait for its response headers, ms (the API client's request deadline). */
  requestTimeoutMs?: number;
  /**
   * Applied to every listed or watched object before it is cached or handed to handlers (client-go's
   * SetTransform): drop what no reader needs, so a cache of a thousand runs stays small.
   */
  transform?: (obj: T) => T;
  /** A secondary key (e.g. a label's value): {@link ReconnectingInformer.byIndex} finds objects by it without a scan. */
  indexBy?: (obj: T) => string | undefined;
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
  private readonly index = new Map<string, Map<string, T>>();
  private readonly handlers: ((event: InformerEvent, obj: T, old?: T) => void)[] = [];
  private readonly log: Logger;
  private resourceVersion = '';
  private stopped = true;
  private watchHandle: WatchHandle | null = null;
  private failures = 0;
  private timer: NodeJS.Timeout | null = null;
  private syncedOnce = false;
  private firstSync: { resolve: () => void; reject: (e: unknown) => void } | null = null;
  /** Counts for health and tests. */
  readonly stats = { lists: 0, watches: 0, gone: 0, reconnects: 0, stalls: 0 };

  constructor(private readonly opts: InformerOptions<T>) {
    this.log = opts.logger ?? silentLogger;
  }

  /**
   * Registers a handler; it runs synchronously on each change, so it must only enqueue work. Returns
   * the function that removes it again.
   */
  on(handler: (event: InformerEvent, obj: T, old?: T) => void): () => void {
    this.handlers.push(handler);
    return () => {
      const i = this.handlers.indexOf(handler);
      if (i >= 0) this.handlers.splice(i, 1);
    };
  }

  /** The cached object of that name. */
  get(name: string): T | undefined {
    return this.cache.get(name);
  }

  /** Cached objects whose `indexBy` key is `key` (empty without `indexBy`). */
  byIndex(key: string): T[] {
    const m = this.index.get(key);
    return m ? [...m.values()] : [];
  }

  private cacheSet(name: string, obj: T): void {
    const old = this.cache.get(name);
    this.cache.set(name, obj);
    const by = this.opts.indexBy;
    if (!by) return;
    const was = old ? by(old) : undefined;
    const is = by(obj);
    if (was !== undefined && was !== is) this.unindex(was, name);
    if (is === undefined) return;
    let m = this.index.get(is);
    if (!m) this.index.set(is, (m = new Map()));
    m.set(name, obj);
  }

  private cacheDelete(name: string): void {
    const old = this.cache.get(name);
    this.cache.delete(name);
    const k = old && this.opts.indexBy?.(old);
    if (k !== undefined) this.unindex(k, name);
  }

  private unindex(key: string, name: string): void {
    const m = this.index.get(key);
    m?.delete(name);
    if (m?.size === 0) this.index.delete(key);
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
    this.watchHandle?.abort();
    this.watchHandle = null;
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
    const transform = this.opts.transform;
    for (const item of res.items) {
      const n = item.metadata?.name;
      if (n) fresh.set(n, transform ? transform(item) : item);
    }
    for (const [n, old] of this.cache) {
      if (!fresh.has(n)) {
        this.cacheDelete(n);
        this.emit('delete', old);
      }
    }
    for (const [n, obj] of fresh) {
      const old = this.cache.get(n);
      this.cacheSet(n, obj);
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
    this.startWatch();
  }

  private startWatch(): void {
    if (this.stopped) return;
    this.stats.watches++;
    const timeoutSeconds = this.opts.watchTimeoutSeconds ?? DEFAULT_WATCH_TIMEOUT_SECONDS;
    const query: Record<string, string | number | boolean> = {
      resourceVersion: this.resourceVersion,
      allowWatchBookmarks: true,
      timeoutSeconds,
    };
    if (this.opts.labelSelector) query.labelSelector = this.opts.labelSelector;
    let gone = false;
    const startedAt = Date.now();
    const onEvent = (type: string, obj: unknown) => {
      if (this.stopped) return;
      if (type === 'ERROR') {
        const status = obj as { code?: number; message?: string };
        if (status?.code === 410) gone = true;
        this.log.debug({ informer: this.opts.name, status }, 'watch error event');
        return;
      }
      const rv = (obj as T)?.metadata?.resourceVersion;
      if (rv) this.resourceVersion = rv;
      if (type === 'BOOKMARK') return;
      const o = obj && this.opts.transform ? this.opts.transform(obj as T) : (obj as T);
      const n = o?.metadata?.name;
      if (!n) return;
      this.failures = 0;
      const old = this.cache.get(n);
      if (type === 'DELETED') {
        this.cacheDelete(n);
        this.emit('delete', o);
      } else if (type === 'ADDED' || type === 'MODIFIED') {
        this.cacheSet(n, o);
        this.emit(old ? 'update' : 'add', o, old);
      }
    };
    const onEnd = (err: Error | null) => {
      this.watchHandle = null;
      if (this.stopped) return;
      if (gone || isGone(err)) {
        this.stats.gone++;
        this.log.debug({ informer: this.opts.name }, 'resourceVersion expired (410); re-listing');
        this.schedule(() => void this.relist(), 0);
        return;
      }
      if (err instanceof WatchStalledError) {
        // The server stopped talking without closing the watch: what happened meanwhile is known
        // only to a fresh list (which has its own deadline, and backs off while the API hangs).
        this.stats.stalls++;
        this.log.warn({ informer: this.opts.name, err: err.message }, 'watch stalled; re-listing');
        this.schedule(() => void this.relist(), 0);
        return;
      }
      if (err) {
        this.failures++;
        this.stats.reconnects++;
        this.log.warn({ err: String(err), informer: this.opts.name }, 'watch broke; reconnecting');
        this.schedule(() => this.startWatch(), this.backoffMs());
        return;
      }
      // A clean end (server timeout or closed connection): resume at once from where we are, but
      // never hot-loop against a server that closes every watch immediately. A watch that lasted
      // (most of) its timeoutSeconds ended as it should: no failure, however short that timeout.
      this.stats.reconnects++;
      if (Date.now() - startedAt >= Math.min(5000, timeoutSeconds * 900)) this.failures = 0;
      this.schedule(() => this.startWatch(), this.failures > 0 ? this.backoffMs() : 0);
      this.failures++;
    };
    this.watchHandle = openWatch({
      kubeConfig: this.opts.kubeConfig,
      path: this.opts.path,
      query,
      connectTimeoutMs: this.opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
      deadlineMs: watchDeadlineMs(timeoutSeconds),
      onEvent,
      onEnd,
    });
  }
}

/**
 * How long after it opened a watch with `timeoutSeconds` must have ended: the server closes it at
 * `timeoutSeconds`; a quarter more (at least 1 s, at most 15 s) is slack for a busy server and the
 * network. Past it the watch is taken as stalled.
 */
export function watchDeadlineMs(timeoutSeconds: number): number {
  return timeoutSeconds * 1000 + Math.min(15_000, Math.max(1000, timeoutSeconds * 250));
}
