/** Wire shape of a session (issue 19). */
import type { SessionRow } from '../store/database.ts';
import { expiresAt, type SessionStatus } from './decide.ts';

const iso = (d: unknown): string | null => (d === null || d === undefined ? null : new Date(d as string).toISOString());

/** A session as the API shows it. */
export function sessionView(r: SessionRow): Record<string, unknown> {
  const ended = r.status === 'ended';
  const clock = {
    status: r.status as SessionStatus,
    createdAt: new Date(r.created_at).getTime(),
    lastUsedAt: new Date(r.last_used_at).getTime(),
    idleTimeoutS: r.idle_timeout_s,
    maxLifetimeS: r.max_lifetime_s,
  };
  return {
    session_id: r.id,
    status: r.status,
    job_type: r.job_type,
    created_at: iso(r.created_at),
    last_used_at: iso(r.last_used_at),
    expires_at: ended ? null : new Date(expiresAt(clock)).toISOString(),
    ended_at: iso(r.ended_at),
    end_reason: r.end_reason,
    cells: r.cells,
    running_cell_id: r.running_cell_id,
    idle_timeout: r.idle_timeout_s,
    max_lifetime: r.max_lifetime_s,
    timeout: r.cell_timeout_s,
    warm: r.warm === true,
  };
}
