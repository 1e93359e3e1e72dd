/**
 * Sessions' pure decisions (issue 19), the house style of runtime/kubernetes/decide.ts: settings with
 * their defaults and bounds, when a session expires and why, admission under `max_sessions`, and what
 * happens to sessions whose owner is gone. No I/O and no clock of its own: `now` is passed in (ms).
 */

/** Defaults and bounds of a session's timeouts, seconds. */
export const SESSION_LIMITS = {
  idleDefault: 300,
  idleMax: 3600,
  lifetimeDefault: 3600,
  lifetimeMax: 86400,
} as const;

/** Why a session ended. */
export type EndReason = 'closed' | 'idle' | 'lifetime' | 'oom' | 'crashed' | 'service_restart';

/** A session's status. */
export type SessionStatus = 'starting' | 'ready' | 'busy' | 'ended';

/** What the expiry decision looks at. */
export interface SessionClock {
  status: SessionStatus;
  /** ms since the epoch. */
  createdAt: number;
  /** The end of the last cell (or the creation), ms. */
  lastUsedAt: number;
  idleTimeoutS: number;
  maxLifetimeS: number;
}

/** When the session expires if nothing happens: the earlier of idle and lifetime expiry (ms). */
export function expiresAt(s: SessionClock): number {
  return Math.min(s.lastUsedAt + s.idleTimeoutS * 1000, s.createdAt + s.maxLifetimeS * 1000);
}

/**
 * Whether the session must end now, and why. The lifetime bounds everything, a running cell included;
 * idleness only counts while no cell runs (a busy session is not idle). Ended sessions stay ended.
 */
export function decideExpiry(s: SessionClock, now: number): 'idle' | 'lifetime' | null {
  if (s.status === 'ended') return null;
  if (now >= s.createdAt + s.maxLifetimeS * 1000) return 'lifetime';
  if (s.status !== 'busy' && now >= s.lastUsedAt + s.idleTimeoutS * 1000) return 'idle';
  return null;
}

/**
 * A session whose owning process stopped heart-beating (it died or was restarted) cannot have a
 * sandbox any more: locally sandboxes die with the service. It ends `service_restart` once its owner
 * has been silent for `staleMs`.
 */
export function decideOrphan(s: { status: SessionStatus; heartbeatAt: number }, now: number, staleMs: number): 'service_restart' | null {
  return s.status !== 'ended' && now - s.heartbeatAt >= staleMs ? 'service_restart' : null;
}

/**
 * What to do with a live session no process here holds, when its sandbox may outlive its owner (a
 * runtime with `adoptSession`, a cluster's pods): `adopt` it when its owner let it go at a graceful
 * stop (`released`) or has been silent for `staleMs` (and its holder lease is gone: the caller's
 * `ownerAlive`); otherwise leave it to its owner. Where sandboxes die with their owner, as
 * {@link decideOrphan}.
 */
export function decideOrphanAction(
  s: { status: SessionStatus; heartbeatAt: number; released: boolean; ownerAlive: boolean },
  now: number,
  staleMs: number,
  canAdopt: boolean,
): 'adopt' | 'service_restart' | null {
  if (s.status === 'ended') return null;
  if (canAdopt && s.released) return 'adopt';
  if (s.ownerAlive) return null;
  const gone = decideOrphan(s, now, staleMs);
  return gone && canAdopt ? 'adopt' : gone;
}

/** Admission: a new session fits while fewer than `max` are live (all processes). */
export function admitSession(live: number, max: number): { ok: true } | { ok: false; message: string } {
  if (max <= 0) return { ok: false, message: 'sessions are disabled on this service (max_sessions is 0)' };
  if (live >= max) return { ok: false, message: `too many sessions: ${live} live of max_sessions ${max}; close one (DELETE /sessions/{id}) or retry later` };
  return { ok: true };
}

/** A session request's settings, validated against the bounds; throws a message for a 400. */
export function sessionSettings(
  req: { idle_timeout?: number | undefined; max_lifetime?: number | undefined; timeout?: number | undefined },
  defaults: { cellTimeoutS: number; maxTimeoutS: number },
): { idleTimeoutS: number; maxLifetimeS: number; cellTimeoutS: number } {
  const idle = req.idle_timeout ?? SESSION_LIMITS.idleDefault;
  const life = req.max_lifetime ?? SESSION_LIMITS.lifetimeDefault;
  const cell = req.timeout ?? Math.min(defaults.cellTimeoutS, defaults.maxTimeoutS);
  const bad = (what: string, max: number, got: number) => `${what} must be an integer between 1 and ${max} seconds, got ${got}`;
  if (!Number.isInteger(idle) || idle < 1 || idle > SESSION_LIMITS.idleMax) throw new RangeError(bad('idle_timeout', SESSION_LIMITS.idleMax, idle));
  if (!Number.isInteger(life) || life < 1 || life > SESSION_LIMITS.lifetimeMax) throw new RangeError(bad('max_lifetime', SESSION_LIMITS.lifetimeMax, life));
  if (!Number.isInteger(cell) || cell < 1 || cell > defaults.maxTimeoutS) throw new RangeError(bad('timeout', defaults.maxTimeoutS, cell));
  return { idleTimeoutS: idle, maxLifetimeS: life, cellTimeoutS: cell };
}

/** The session's status after a cell, from how the sandbox is. */
export function afterCell(sandboxEnded: 'oom' | 'crashed' | 'closed' | null): { status: SessionStatus; endReason: EndReason | null } {
  if (sandboxEnded === 'oom') return { status: 'ended', endReason: 'oom' };
  if (sandboxEnded) return { status: 'ended', endReason: 'crashed' };
  return { status: 'ready', endReason: null };
}
