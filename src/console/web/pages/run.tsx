/**
 * One run: live status, phase and output from the event stream (events.ts), then the record:
 * timing, error, result, input, code and artifacts to download; cancel while it runs, rerun after.
 */
import { useEffect, useReducer, useState } from 'preact/hooks';
import { ApiError, api, downloadArtifact, getToken, isTerminal, showJson, type Artifact, type RunRecord } from '../api.ts';
import { followRun, type FollowMode, type StatusEvent } from '../events.ts';
import { ErrorBox, fmtBytes, fmtMs, fmtTime, href, Section, StatusBadge, usePoll } from '../ui.tsx';

interface Live {
  status?: string;
  phase?: string;
  timing?: StatusEvent['timing'];
  stdout: string;
  stderr: string;
  truncated: { stdout: boolean; stderr: boolean };
  artifacts: Artifact[];
  record?: RunRecord;
  mode: FollowMode;
  error?: Error;
}

type Action =
  | { t: 'status'; e: StatusEvent }
  | { t: 'output'; stream: 'stdout' | 'stderr'; data: string }
  | { t: 'truncated'; stream: 'stdout' | 'stderr' }
  | { t: 'artifact'; a: Artifact }
  | { t: 'end'; record: RunRecord }
  | { t: 'mode'; mode: FollowMode }
  | { t: 'error'; error: Error }
  | { t: 'reset' };

const initial: Live = { stdout: '', stderr: '', truncated: { stdout: false, stderr: false }, artifacts: [], mode: 'connecting' };

function reduce(s: Live, a: Action): Live {
  switch (a.t) {
    case 'status':
      return { ...s, status: a.e.status, phase: a.e.phase ?? s.phase, timing: a.e.timing ?? s.timing };
    case 'output':
      return { ...s, [a.stream]: s[a.stream] + a.data };
    case 'truncated':
      return { ...s, truncated: { ...s.truncated, [a.stream]: true } };
    case 'artifact':
      return { ...s, artifacts: [...s.artifacts.filter((x) => x.name !== a.a.name), a.a] };
    case 'end':
      // The record is the final word: its output is what the stream sent, whole.
      return { ...s, record: a.record, status: a.record.status, stdout: a.record.stdout, stderr: a.record.stderr, truncated: { stdout: !!a.record.stdout_truncated, stderr: !!a.record.stderr_truncated } };
    case 'mode':
      return { ...s, mode: a.mode };
    case 'error':
      return { ...s, error: a.error };
    case 'reset':
      return initial;
  }
}

const MODE_TEXT: Record<FollowMode, string> = {
  connecting: 'connecting…',
  stream: 'live',
  reconnecting: 'connection lost, resuming…',
  polling: 'following by polling (output appears when the run ends)',
  ended: 'finished',
};

export function RunPage({ id }: { id: string }) {
  const [live, send] = useReducer(reduce, initial);
  const [actionError, setActionError] = useState<Error>();
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    send({ t: 'reset' });
    return followRun(id, {
      status: (e) => send({ t: 'status', e }),
      output: (stream, data) => send({ t: 'output', stream, data }),
      truncated: (stream) => send({ t: 'truncated', stream }),
      artifact: (a) => send({ t: 'artifact', a }),
      end: (record) => send({ t: 'end', record }),
      mode: (mode) => send({ t: 'mode', mode }),
      error: (error) => send({ t: 'error', error }),
    });
  }, [id]);
  // The record as it is now (job type, times, input) until the final one arrives with `end`.
  const first = usePoll(() => api.record(id), 0, id);
  const rec = live.record ?? first.data;
  const status = live.status ?? first.data?.status ?? 'queued';
  const code = usePoll(() => api.artifactText(id, '_code.py'), 0, id);

  const act = async (f: () => Promise<unknown>) => {
    setBusy(true);
    setActionError(undefined);
    try {
      await f();
    } catch (err) {
      setActionError(err as Error);
    } finally {
      setBusy(false);
    }
  };
  const rerun = () =>
    act(async () => {
      const r = await api.rerun(id);
      location.hash = href(['runs', r.job_id]);
    });
  const timing = rec?.timing ?? live.timing;
  const final = live.record ?? (first.data && isTerminal(first.data.status) ? first.data : undefined);
  const artifacts = final?.artifacts ?? live.artifacts;

  if (first.error instanceof ApiError && first.error.status === 404) {
    return (
      <div>
        <h1>
          Run <span class="mono">{id}</span>
        </h1>
        <ErrorBox error={first.error} />
        <p>
          <a href={href(['runs'])}>All runs</a>
        </p>
      </div>
    );
  }

  return (
    <div>
      <div class="toolbar">
        <h1>
          Run <span class="mono">{id}</span>
        </h1>
        <StatusBadge status={status} />
        {!isTerminal(status) && live.phase ? <span class="phase">{live.phase}</span> : null}
        <span class="muted follow" data-mode={live.mode}>
          {MODE_TEXT[live.mode]}
        </span>
        {!isTerminal(status) ? (
          <button type="button" disabled={busy} onClick={() => act(() => api.cancel(id))}>
            Cancel
          </button>
        ) : (
          <button type="button" disabled={busy} onClick={rerun}>
            Rerun
          </button>
        )}
      </div>
      <ErrorBox error={live.error} />
      <ErrorBox error={actionError} />
      <dl class="facts">
        <dt>Job type</dt>
        <dd>{rec ? `${rec.job_type} (${rec.job_version})` : '—'}</dd>
        <dt>Created</dt>
        <dd>{fmtTime(rec?.created_at)}</dd>
        <dt>Started</dt>
        <dd>{fmtTime(rec?.started_at)}</dd>
        <dt>Ended</dt>
        <dd>{fmtTime(rec?.ended_at)}</dd>
        <dt>Exit code</dt>
        <dd>{rec?.exit_code ?? '—'}</dd>
        {rec?.parent_execution_id ? (
          <>
            <dt>{rec.relationship === 'fork' ? 'Forked from' : 'Rerun of'}</dt>
            <dd>
              <a class="mono" href={href(['runs', rec.parent_execution_id])}>
                {rec.parent_execution_id}
              </a>
            </dd>
          </>
        ) : null}
      </dl>

      {rec?.error ? (
        <Section title="Error" id="error">
          <p class="error">
            <strong>{rec.error.type}</strong>
            {rec.error.phase ? ` (${rec.error.phase})` : ''}: {rec.error.message}
          </p>
        </Section>
      ) : null}

      <Section title="Output" id="output">
        <h3>stdout{live.truncated.stdout ? ' (truncated)' : ''}</h3>
        <pre class="out" id="stdout">{live.stdout}</pre>
        {live.stderr || live.truncated.stderr ? (
          <>
            <h3>stderr{live.truncated.stderr ? ' (truncated)' : ''}</h3>
            <pre class="out err" id="stderr">{live.stderr}</pre>
          </>
        ) : null}
        {rec && rec.output !== null ? (
          <>
            <h3>result.json</h3>
            <pre class="out" id="result">{showJson(rec.output)}</pre>
          </>
        ) : null}
      </Section>

      <Section title="Timing" id="timing">
        <table class="kv">
          <tbody>
            <tr>
              <th>Start-up</th>
              <td>{fmtMs(timing?.startup_ms)}</td>
            </tr>
            <tr>
              <th>Installing requirements</th>
              <td>{fmtMs(timing?.dep_install_ms)}</td>
            </tr>
            <tr>
              <th>Execution</th>
              <td>{fmtMs(timing?.execution_ms)}</td>
            </tr>
            <tr>
              <th>Total</th>
              <td>{fmtMs(timing?.total_ms ?? rec?.duration_ms)}</td>
            </tr>
            {timing?.phase_at_exit ? (
              <tr>
                <th>Phase at exit</th>
                <td>{timing.phase_at_exit}</td>
              </tr>
            ) : null}
            {rec?.resource_usage ? (
              <tr>
                <th>Resources</th>
                <td>
                  {String(rec.resource_usage.max_rss_mb)} MB peak memory, {fmtMs(rec.resource_usage.cpu_time_ms)} CPU
                </td>
              </tr>
            ) : null}
          </tbody>
        </table>
      </Section>

      <Section title="Artifacts" id="artifacts">
        {artifacts.length === 0 ? <p class="muted">{final ? 'No files in /output.' : 'Known when the run ends.'}</p> : <ArtifactTable id={id} items={artifacts} />}
        {final?.artifacts_truncated ? (
          <p class="muted" id="artifacts-truncated">
            Only the first {artifacts.length} of {final.artifacts_total ?? 'more'} entries in /output are listed; the rest were not kept.
          </p>
        ) : null}
      </Section>

      <Section title="Input" id="input">
        {rec ? (
          <>
            <pre class="out" id="input-data">{showJson(rec.input_data ?? {})}</pre>
            <p class="muted">
              Requirements: {rec.requirements?.length ? rec.requirements.join(', ') : 'none'} · timeout {rec.timeout ?? '—'} s
            </p>
          </>
        ) : (
          <p class="muted">Loading…</p>
        )}
        {rec?.input_artifacts?.length ? <ArtifactTable id={id} items={rec.input_artifacts} /> : null}
      </Section>

      <Section title="Code" id="code">
        <ErrorBox error={code.error} />
        <pre class="out code">{code.data ?? ''}</pre>
      </Section>
    </div>
  );
}

function ArtifactTable({ id, items }: { id: string; items: Artifact[] }) {
  const [error, setError] = useState<Error>();
  // With a token a link cannot authenticate: fetch and hand over a blob instead.
  const withToken = getToken() !== null;
  return (
    <>
      <ErrorBox error={error} />
      <table class="artifacts">
        <thead>
          <tr>
            <th>Name</th>
            <th>Size</th>
            <th>Type</th>
            <th>SHA-256</th>
          </tr>
        </thead>
        <tbody>
          {items.map((a) => (
            <tr data-artifact={a.name}>
              <td>
                {a.skipped ? (
                  <span>
                    {a.name} <span class="muted">(not kept: {a.skipped})</span>
                  </span>
                ) : withToken ? (
                  <a
                    href={api.artifactUrl(id, a.name)}
                    download={a.name}
                    onClick={(e) => {
                      e.preventDefault();
                      downloadArtifact(id, a.name).catch((err: unknown) => setError(err as Error));
                    }}
                  >
                    {a.name}
                  </a>
                ) : (
                  <a href={api.artifactUrl(id, a.name)} download={a.name}>
                    {a.name}
                  </a>
                )}
              </td>
              <td>{fmtBytes(a.size_bytes)}</td>
              <td>{a.content_type}</td>
              <td class="mono clip" title={a.sha256}>
                {a.sha256.slice(0, 12)}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  );
}
