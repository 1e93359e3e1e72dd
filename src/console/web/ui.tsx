/** Small pieces the pages share: the hash router, a polling hook, formatting, badges. */
import type { ComponentChildren } from 'preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';

/** The current route: `#/runs/abc?x=1` → { path: ['runs', 'abc'], query }. */
export interface Route {
  path: string[];
  query: URLSearchParams;
}

export function parseHash(hash: string): Route {
  const h = hash.replace(/^#\/?/, '');
  const q = h.indexOf('?');
  const path = (q < 0 ? h : h.slice(0, q)).split('/').filter(Boolean).map(decodeURIComponent);
  return { path, query: new URLSearchParams(q < 0 ? '' : h.slice(q + 1)) };
}

/** A hash link target for a path and query. */
export function href(path: string[], query: Record<string, string | number | undefined> = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== '') q.set(k, String(v));
  const qs = q.toString();
  return `#/${path.map(encodeURIComponent).join('/')}${qs ? `?${qs}` : ''}`;
}

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseHash(location.hash));
  useEffect(() => {
    const on = () => setRoute(parseHash(location.hash));
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return route;
}

export interface Loaded<T> {
  data: T | undefined;
  error: Error | undefined;
  loading: boolean;
  reload: () => void;
}

/**
 * Calls `load` now and then every `everyMs` (0: once) while the tab is visible; `key` restarts it.
 * An answer to an older key is dropped.
 */
export function usePoll<T>(load: () => Promise<T>, everyMs: number, key: string): Loaded<T> {
  const [state, setState] = useState<{ data?: T; error?: Error; loading: boolean }>({ loading: true });
  const [tick, setTick] = useState(0);
  const loadRef = useRef(load);
  loadRef.current = load;
  useEffect(() => {
    let live = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    setState((s) => ({ ...s, loading: true }));
    const run = async () => {
      try {
        const data = await loadRef.current();
        if (live) setState({ data, loading: false });
      } catch (err) {
        if (live) setState((s) => ({ ...s, error: err as Error, loading: false }));
      }
      if (live && everyMs > 0) timer = setTimeout(() => (document.visibilityState === 'hidden' ? waitVisible() : void run()), everyMs);
    };
    const waitVisible = () => {
      const on = () => {
        document.removeEventListener('visibilitychange', on);
        if (live) void run();
      };
      document.addEventListener('visibilitychange', on);
    };
    void run();
    return () => {
      live = false;
      if (timer) clearTimeout(timer);
    };
  }, [key, tick, everyMs]);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { data: state.data, error: state.error, loading: state.loading, reload };
}

export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function fmtMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return '—';
  const n = Number(ms);
  if (n < 1000) return `${n} ms`;
  if (n < 60_000) return `${(n / 1000).toFixed(2)} s`;
  return `${Math.floor(n / 60_000)} min ${Math.round((n % 60_000) / 1000)} s`;
}

export function fmtBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

export function StatusBadge({ status }: { status: string }) {
  return <span class={`badge status-${status}`} data-status={status}>{status}</span>;
}

export function ErrorBox({ error }: { error: Error | undefined }) {
  if (!error) return null;
  return (
    <p class="error" role="alert">
      {error.message}
    </p>
  );
}

export function Section({ title, children, id }: { title: string; children: ComponentChildren; id?: string }) {
  return (
    <section class="card" id={id}>
      <h2>{title}</h2>
      {children}
    </section>
  );
}
