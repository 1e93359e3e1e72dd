/** The runs list (`GET /executions`): newest first, filters in the address, refreshed every 2 s. */
import { api, RECORD_STATUSES } from '../api.ts';
import { ErrorBox, fmtMs, fmtTime, href, StatusBadge, usePoll, type Route } from '../ui.tsx';

const PAGE = 50;
const REFRESH_MS = 2000;

export function RunsPage({ route }: { route: Route }) {
  const status = route.query.get('status') ?? '';
  const jobType = route.query.get('job_type') ?? '';
  const offset = Math.max(0, Number(route.query.get('offset') ?? 0) || 0);
  const types = usePoll(() => api.jobTypes(), 0, 'types');
  const page = usePoll(() => api.executions({ status: status || undefined, job_type: jobType || undefined, limit: PAGE, offset }), REFRESH_MS, `${status}|${jobType}|${offset}`);
  const go = (q: Record<string, string | number | undefined>) => {
    location.hash = href(['runs'], { status, job_type: jobType, ...q });
  };

  return (
    <div>
      <div class="toolbar">
        <h1>Runs</h1>
        <label>
          Status{' '}
          <select name="status" value={status} onChange={(e) => go({ status: e.currentTarget.value, offset: undefined })}>
            <option value="">any</option>
            {RECORD_STATUSES.map((s) => (
              <option value={s}>{s}</option>
            ))}
          </select>
        </label>
        <label>
          Job type{' '}
          <select name="job_type" value={jobType} onChange={(e) => go({ job_type: e.currentTarget.value, offset: undefined })}>
            <option value="">any</option>
            {(types.data ?? []).map((t) => (
              <option value={t.name}>{t.name}</option>
            ))}
            {jobType && !(types.data ?? []).some((t) => t.name === jobType) ? <option value={jobType}>{jobType}</option> : null}
          </select>
        </label>
        <a class="button" href="#/submit">
          New run
        </a>
      </div>
      <ErrorBox error={page.error} />
      {page.data ? (
        <>
          <table class="runs">
            <thead>
              <tr>
                <th>Run</th>
                <th>Status</th>
                <th>Job type</th>
                <th>Created</th>
                <th>Duration</th>
                <th>Exit</th>
                <th>Error</th>
              </tr>
            </thead>
            <tbody>
              {page.data.items.map((r) => (
                <tr data-run={r.execution_id}>
                  <td>
                    <a class="mono" href={href(['runs', r.execution_id])}>
                      {r.execution_id}
                    </a>
                  </td>
                  <td>
                    <StatusBadge status={r.status} />
                  </td>
                  <td>{r.job_type}</td>
                  <td>{fmtTime(r.created_at)}</td>
                  <td>{fmtMs(r.duration_ms)}</td>
                  <td>{r.exit_code ?? '—'}</td>
                  <td class="clip">{r.error ? `${r.error.type}: ${r.error.message}` : ''}</td>
                </tr>
              ))}
            </tbody>
          </table>
          {page.data.items.length === 0 ? <p class="muted">No runs{status || jobType ? ' match these filters' : ' yet'}.</p> : null}
          <div class="pager">
            <button type="button" disabled={offset === 0} onClick={() => go({ offset: Math.max(0, offset - PAGE) || undefined })}>
              Newer
            </button>
            <span class="muted">
              {page.data.items.length ? `${offset + 1}–${offset + page.data.items.length}` : ''}
            </span>
            <button type="button" disabled={!page.data.has_more} onClick={() => go({ offset: offset + PAGE })}>
              Older
            </button>
          </div>
        </>
      ) : page.loading ? (
        <p class="muted">Loading…</p>
      ) : null}
    </div>
  );
}
