/** The sessions (GET /sessions), newest first, and a button that starts one (POST /sessions). */
import { useState } from 'preact/hooks';
import { api } from '../api.ts';
import { ErrorBox, fmtTime, href, StatusBadge, usePoll } from '../ui.tsx';

export function SessionsPage() {
  const page = usePoll(() => api.sessions({ limit: 50 }), 5000, 'sessions');
  const types = usePoll(() => api.jobTypes(), 0, 'types');
  const [jobType, setJobType] = useState('default');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<Error>();
  const start = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      const s = await api.createSession({ job_type: jobType });
      location.hash = href(['sessions', s.session_id]);
    } catch (err) {
      setError(err as Error);
    } finally {
      setBusy(false);
    }
  };
  // Every job type can have sessions (its requirements are installed at the start, docs/api.md).
  const usable = types.data ?? [{ name: 'default' }];
  return (
    <div>
      <form class="toolbar" onSubmit={start}>
        <h1>Sessions</h1>
        <label>
          Job type{' '}
          <select name="job_type" value={jobType} onChange={(e) => setJobType(e.currentTarget.value)}>
            {usable.map((t) => (
              <option value={t.name}>{t.name}</option>
            ))}
          </select>
        </label>
        <button type="submit" class="primary" disabled={busy}>
          {busy ? 'Starting…' : 'New session'}
        </button>
      </form>
      <p class="muted">A session keeps one Python interpreter: variables, imports and the files of /workspace stay from one cell to the next.</p>
      <ErrorBox error={error} />
      <ErrorBox error={page.error} />
      {page.data ? (
        <table class="runs">
          <thead>
            <tr>
              <th>Session</th>
              <th>Status</th>
              <th>Job type</th>
              <th>Cells</th>
              <th>Created</th>
              <th>Last used</th>
            </tr>
          </thead>
          <tbody>
            {page.data.items.map((s) => (
              <tr data-session={s.session_id}>
                <td>
                  <a class="mono" href={href(['sessions', s.session_id])}>
                    {s.session_id}
                  </a>
                </td>
                <td>
                  <StatusBadge status={s.status} /> {s.end_reason ? <span class="muted">{s.end_reason}</span> : null}
                </td>
                <td>{s.job_type}</td>
                <td>{s.cells}</td>
                <td>{fmtTime(s.created_at)}</td>
                <td>{fmtTime(s.last_used_at)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : page.loading ? (
        <p class="muted">Loading…</p>
      ) : null}
      {page.data?.items.length === 0 ? <p class="muted">No sessions yet.</p> : null}
    </div>
  );
}
