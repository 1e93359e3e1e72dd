/** The dead letter queue (`GET /dlq`, `GET /dlq/stats`): filter by error type, read the job, delete an entry. */
import { useState } from 'preact/hooks';
import { api } from '../api.ts';
import { ErrorBox, fmtTime, href, usePoll, type Route } from '../ui.tsx';

const PAGE = 50;

export function DlqPage({ route }: { route: Route }) {
  const errorType = route.query.get('error_type') ?? '';
  const offset = Math.max(0, Number(route.query.get('offset') ?? 0) || 0);
  const [tick, setTick] = useState(0);
  const [error, setError] = useState<Error>();
  const stats = usePoll(() => api.dlqStats(), 5000, String(tick));
  const page = usePoll(() => api.dlq({ error_type: errorType || undefined, limit: PAGE, offset }), 5000, `${errorType}|${offset}|${tick}`);
  const go = (q: Record<string, string | number | undefined>) => {
    location.hash = href(['dlq'], { error_type: errorType, ...q });
  };
  const remove = async (id: number) => {
    setError(undefined);
    try {
      await api.dlqDelete(id);
      setTick((t) => t + 1);
    } catch (err) {
      setError(err as Error);
    }
  };

  return (
    <div>
      <div class="toolbar">
        <h1>Dead letter queue</h1>
        <span class="muted" id="dlq-total">
          {stats.data ? `${stats.data.total} ${stats.data.total === 1 ? 'entry' : 'entries'}` : ''}
        </span>
        <label>
          Error type{' '}
          <select name="error_type" value={errorType} onChange={(e) => go({ error_type: e.currentTarget.value, offset: undefined })}>
            <option value="">any</option>
            {Object.entries(stats.data?.by_error_type ?? {}).map(([t, n]) => (
              <option value={t}>
                {t} ({n})
              </option>
            ))}
          </select>
        </label>
      </div>
      <p class="muted">Runs that failed for the service's reasons (internal, sandbox or configuration errors) after their retries.</p>
      <ErrorBox error={stats.error ?? page.error} />
      <ErrorBox error={error} />
      {page.data ? (
        <>
          <table class="dlq">
            <thead>
              <tr>
                <th>Entry</th>
                <th>Run</th>
                <th>Error</th>
                <th>Retries</th>
                <th>Created</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {page.data.items.map((d) => (
                <tr data-dlq={d.id}>
                  <td>{d.id}</td>
                  <td>
                    <a class="mono" href={href(['runs', d.job_id])}>
                      {d.job_id}
                    </a>
                    <details>
                      <summary>code</summary>
                      <pre class="out code">{d.job_data.code}</pre>
                    </details>
                  </td>
                  <td>
                    <strong>{d.error_type}</strong>: {d.error_message}
                  </td>
                  <td>{d.retry_count}</td>
                  <td>{fmtTime(d.created_at)}</td>
                  <td>
                    <button type="button" onClick={() => void remove(d.id)}>
                      Delete
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          {page.data.items.length === 0 ? <p class="muted">The queue is empty.</p> : null}
          <div class="pager">
            <button type="button" disabled={offset === 0} onClick={() => go({ offset: Math.max(0, offset - PAGE) || undefined })}>
              Newer
            </button>
            <button type="button" disabled={!page.data.has_more} onClick={() => go({ offset: offset + PAGE })}>
              Older
            </button>
          </div>
        </>
      ) : null}
    </div>
  );
}
