/**
 * One session: its cells in order, each with its code, its output as it is written and how it ended,
 * from the session's event stream (`GET /sessions/{id}/events`, docs/api.md), and a box that runs
 * the next cell (`POST /sessions/{id}/execute`). The stream replays earlier cells first, so the page
 * shows the whole session however it was reached; it ends with the session.
 */
import type { EventSourceMessage } from 'eventsource-parser';
import { useEffect, useState } from 'preact/hooks';
import { api, parseExact, showJson, type RunError } from '../api.ts';
import { PythonEditor } from '../editor.tsx';
import { readEvents, type FollowMode } from '../events.ts';
import { ErrorBox, fmtMs, fmtTime, href, Section, StatusBadge, usePoll } from '../ui.tsx';

interface Cell {
  cell: number;
  executionId: string;
  status: string;
  /** stdout and stderr as they came, in order. */
  chunks: { stream: 'stdout' | 'stderr'; text: string }[];
  error: RunError | null;
  output: unknown;
  durationMs: number | null;
  truncated: boolean;
}

/** Applies one session event to the cells (by number); returns the new list, or null when nothing changed. */
export function applyEvent(cells: Cell[], ev: Pick<EventSourceMessage, 'event' | 'data'>): Cell[] | null {
  const d = parseExact(ev.data) as Record<string, unknown> & { cell?: number; execution_id?: string };
  if (typeof d.cell !== 'number') return null;
  const i = cells.findIndex((c) => c.cell === d.cell);
  if (ev.event === 'cell') {
    if (i >= 0) return null;
    const fresh: Cell = { cell: d.cell, executionId: String(d.execution_id), status: String(d.status ?? 'running'), chunks: [], error: null, output: null, durationMs: null, truncated: false };
    return [...cells, fresh].sort((a, b) => a.cell - b.cell);
  }
  if (i < 0) return null;
  const c = { ...cells[i]! };
  if (ev.event === 'stdout' || ev.event === 'stderr') {
    const last = c.chunks[c.chunks.length - 1];
    const text = String(d.data ?? '');
    c.chunks = last?.stream === ev.event ? [...c.chunks.slice(0, -1), { stream: ev.event, text: last.text + text }] : [...c.chunks, { stream: ev.event, text }];
  } else if (ev.event === 'truncated') c.truncated = true;
  else if (ev.event === 'cell_end') {
    c.status = String(d.status);
    c.error = (d.error as RunError | null) ?? null;
    c.output = d.output ?? null;
    c.durationMs = typeof d.duration_ms === 'number' ? d.duration_ms : null;
  } else return null;
  return cells.map((x, k) => (k === i ? c : x));
}

export function SessionPage({ id }: { id: string }) {
  const session = usePoll(() => api.session(id), 5000, id);
  const [cells, setCells] = useState<Cell[]>([]);
  const [mode, setMode] = useState<FollowMode>('connecting');
  const [streamError, setStreamError] = useState<Error>();
  const [code, setCode] = useState('');
  const [editorKey, setEditorKey] = useState(0);
  const [busy, setBusy] = useState(false);
  const [runError, setRunError] = useState<Error>();

  useEffect(() => {
    const ctl = new AbortController();
    setCells([]);
    readEvents(`sessions/${encodeURIComponent(id)}/events`, ctl.signal, {
      onEvent(ev) {
        if (ev.event === 'end') {
          session.reload();
          return true;
        }
        setCells((cs) => applyEvent(cs, ev) ?? cs);
        return false;
      },
      mode: setMode,
      onNotFound: async () => void (await api.session(id)),
    }).catch((err: unknown) => {
      if (!ctl.signal.aborted) setStreamError(err as Error);
    });
    return () => ctl.abort();
  }, [id]);

  const s = session.data;
  const ended = s?.status === 'ended';
  const run = async (e: Event) => {
    e.preventDefault();
    if (!code.trim()) return;
    setBusy(true);
    setRunError(undefined);
    try {
      await api.execute(id, code);
      setCode('');
      setEditorKey((k) => k + 1);
    } catch (err) {
      setRunError(err as Error);
    } finally {
      setBusy(false);
      session.reload();
    }
  };
  const close = async () => {
    try {
      await api.closeSession(id);
    } catch (err) {
      setRunError(err as Error);
    }
    session.reload();
  };

  return (
    <div class="session">
      <div class="toolbar">
        <h1>
          <a href={href(['sessions'])}>Sessions</a> / <span class="mono">{id}</span>
        </h1>
        {s ? <StatusBadge status={s.status} /> : null}
        {s?.end_reason ? <span id="end-reason">ended: {s.end_reason}</span> : null}
        <span class="muted">{mode === 'stream' ? 'live' : mode}</span>
        {s && !ended ? (
          <button type="button" onClick={close}>
            Close session
          </button>
        ) : null}
      </div>
      <ErrorBox error={session.error} />
      <ErrorBox error={streamError} />
      {s ? (
        <p class="muted">
          {s.job_type} · {s.cells} cell{s.cells === 1 ? '' : 's'} · created {fmtTime(s.created_at)}
          {s.expires_at ? ` · ends by ${fmtTime(s.expires_at)} unless used` : ''} · cell timeout {s.timeout} s
        </p>
      ) : null}
      {cells.length === 0 && mode !== 'connecting' ? <p class="muted">No cells yet.</p> : null}
      {cells.map((c) => (
        <CellCard key={c.executionId} c={c} />
      ))}
      {!ended ? (
        <form class="card next-cell" onSubmit={run}>
          <h2>Cell {(s?.cells ?? cells.length) + 1}</h2>
          <PythonEditor key={editorKey} value="" onChange={setCode} label="Next cell" />
          <ErrorBox error={runError} />
          <button type="submit" class="primary" disabled={busy || !code.trim()}>
            {busy ? 'Running…' : 'Run cell'}
          </button>
        </form>
      ) : null}
    </div>
  );
}

function CellCard({ c }: { c: Cell }) {
  const code = usePoll(() => api.artifactText(c.executionId, '_code.py'), 0, c.executionId);
  return (
    <Section title={`Cell ${c.cell}`}>
      <div class="cell" data-cell={c.cell} data-status={c.status}>
        <p>
          <StatusBadge status={c.status} /> <a href={href(['runs', c.executionId])}>record</a>
          {c.durationMs !== null ? <span class="muted"> · {fmtMs(c.durationMs)}</span> : null}
        </p>
        <pre class="out code cell-code">{code.data ?? ''}</pre>
        {c.chunks.length ? (
          <pre class="out cell-output">
            {c.chunks.map((k) => (
              <span class={k.stream === 'stderr' ? 'stderr' : undefined}>{k.text}</span>
            ))}
          </pre>
        ) : null}
        {c.truncated ? <p class="muted">Output was cut at the service's max_stdout_bytes.</p> : null}
        {c.error ? (
          <p class="error cell-error">
            {c.error.type}: {c.error.message}
          </p>
        ) : null}
        {c.output !== null && c.output !== undefined ? <pre class="out cell-result">{showJson(c.output)}</pre> : null}
      </div>
    </Section>
  );
}
