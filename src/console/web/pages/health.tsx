/** Health (`GET /health`, 200 or 503 with the same body) and this replica's pool (`GET /pool/stats`), every 5 s. */
import { api } from '../api.ts';
import { ErrorBox, fmtMs, fmtTime, Section, usePoll } from '../ui.tsx';

export function HealthPage() {
  const health = usePoll(() => api.health(), 5000, 'health');
  const pool = usePoll(() => api.pool(), 5000, 'pool');
  // Without a valid token (authentication on) /health says only its status: the details wait for one.
  const status = health.data?.status;
  const h = health.data && 'reasons' in health.data ? health.data : null;
  const p = pool.data;
  return (
    <div>
      <div class="toolbar">
        <h1>Health</h1>
        {status ? (
          <span class={`badge health-${status}`} id="health-status">
            {status}
          </span>
        ) : null}
      </div>
      <ErrorBox error={health.error} />
      {h ? (
        <>
          {h.reasons.length ? (
            <ul class="error">
              {h.reasons.map((r) => (
                <li>{r}</li>
              ))}
            </ul>
          ) : null}
          {h.sandbox.warning ? <p class="error">{h.sandbox.warning}</p> : null}
          <Section title="Service" id="service">
            <table class="kv">
              <tbody>
                <tr><th>Version</th><td>{h.version}</td></tr>
                <tr><th>Runtime</th><td>{h.runtime}</td></tr>
                <tr><th>Sandbox engine</th><td id="engine">{h.sandbox.engine}{h.sandbox.isolated ? '' : ' (no isolation)'}</td></tr>
                <tr><th>Security mode</th><td>{h.sandbox.security_mode}</td></tr>
                <tr><th>Limits</th><td>{h.sandbox.limits}</td></tr>
                <tr><th>gVisor</th><td>{h.gvisor_available ? 'available' : 'not available'}</td></tr>
                <tr><th>Database</th><td>{h.database.kind}, {h.database.available ? 'answering' : 'NOT answering'}</td></tr>
                <tr><th>Production mode</th><td>{h.production_mode ? 'on' : 'off'}</td></tr>
                <tr>
                  <th>Circuit breaker</th>
                  <td>
                    {h.circuit_breaker.state} ({h.circuit_breaker.failure_count} failures{h.circuit_breaker.last_failure ? `, last ${fmtTime(h.circuit_breaker.last_failure)}` : ''})
                  </td>
                </tr>
                <tr>
                  <th>Queue</th>
                  <td>
                    {h.queue_stats.pending} queued, {h.queue_stats.running} running, {h.queue_stats.max_workers} workers, at most {h.queue_stats.max_queue_size}
                  </td>
                </tr>
              </tbody>
            </table>
          </Section>
        </>
      ) : null}
      <ErrorBox error={pool.error} />
      {p ? (
        <Section title={`Pool of ${p.worker_id}`} id="pool">
          <table class="kv">
            <tbody>
              <tr><th>Slots</th><td id="slots">{p.slots.busy} busy, {p.slots.free} free of {p.slots.size}; {p.slots.waiting_sync} synchronous callers waiting</td></tr>
              <tr><th>Queue (all replicas)</th><td>{p.queue.queued} queued, {p.queue.running} running, at most {p.queue.max_queue_size}; oldest waiting {fmtMs(p.queue.oldest_queued_age_ms)}</td></tr>
              <tr><th>Breaker</th><td>{p.breaker}</td></tr>
            </tbody>
          </table>
          {Object.keys(p.by_job_type).length ? (
            <table>
              <thead>
                <tr><th>Job type</th><th>Queued</th><th>Running</th></tr>
              </thead>
              <tbody>
                {Object.entries(p.by_job_type).map(([t, c]) => (
                  <tr><td>{t}</td><td>{c.queued}</td><td>{c.running}</td></tr>
                ))}
              </tbody>
            </table>
          ) : null}
        </Section>
      ) : null}
    </div>
  );
}
