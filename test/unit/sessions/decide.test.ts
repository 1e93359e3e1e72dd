import { describe, expect, it } from 'vitest';
import { admitSession, afterCell, decideExpiry, decideOrphan, decideOrphanAction, expiresAt, sessionSettings, type SessionClock } from '../../../src/sessions/decide.ts';

const T0 = Date.UTC(2026, 11, 1, 12, 0, 0);
const s = (o: Partial<SessionClock> = {}): SessionClock => ({ status: 'ready', createdAt: T0, lastUsedAt: T0, idleTimeoutS: 300, maxLifetimeS: 3600, ...o });
const sec = (n: number) => T0 + n * 1000;

describe('decideExpiry', () => {
  const table: [string, SessionClock, number, ReturnType<typeof decideExpiry>][] = [
    ['fresh', s(), sec(0), null],
    ['idle one second short', s(), sec(299), null],
    ['idle exactly', s(), sec(300), 'idle'],
    ['used recently', s({ lastUsedAt: sec(200) }), sec(499), null],
    ['idle after last use', s({ lastUsedAt: sec(200) }), sec(500), 'idle'],
    ['busy is never idle', s({ status: 'busy' }), sec(3000), null],
    ['busy past lifetime', s({ status: 'busy', lastUsedAt: sec(3500) }), sec(3600), 'lifetime'],
    ['lifetime before idle', s({ lastUsedAt: sec(3500), idleTimeoutS: 3600 }), sec(3600), 'lifetime'],
    ['lifetime wins when both are due', s({ idleTimeoutS: 10, maxLifetimeS: 10 }), sec(10), 'lifetime'],
    ['starting past idle', s({ status: 'starting' }), sec(300), 'idle'],
    ['ended stays ended', s({ status: 'ended' }), sec(100000), null],
  ];
  it.each(table)('%s', (_n, session, now, want) => {
    expect(decideExpiry(session, now)).toBe(want);
  });

  it('expiresAt is the earlier of idle and lifetime expiry, and decideExpiry fires exactly there', () => {
    for (const session of [s(), s({ lastUsedAt: sec(3400) }), s({ idleTimeoutS: 3600, maxLifetimeS: 60 })]) {
      const at = expiresAt(session);
      expect(decideExpiry(session, at - 1)).toBeNull();
      expect(decideExpiry(session, at)).not.toBeNull();
    }
    expect(expiresAt(s({ lastUsedAt: sec(3400) }))).toBe(sec(3600));
  });
});

describe('decideOrphan', () => {
  it.each([
    ['owner alive', 'ready', sec(0), sec(4), null],
    ['owner silent past the bound', 'ready', sec(0), sec(10), 'service_restart'],
    ['busy with a silent owner', 'busy', sec(0), sec(11), 'service_restart'],
    ['ended already', 'ended', sec(0), sec(100), null],
  ] as const)('%s', (_n, status, heartbeatAt, now, want) => {
    expect(decideOrphan({ status, heartbeatAt }, now, 10_000)).toBe(want);
  });
});

describe('admitSession', () => {
  it('admits below the maximum, refuses at it with a message naming max_sessions', () => {
    expect(admitSession(0, 2)).toEqual({ ok: true });
    expect(admitSession(1, 2)).toEqual({ ok: true });
    const r = admitSession(2, 2);
    expect(r.ok).toBe(false);
    expect(!r.ok && r.message).toMatch(/2 live of max_sessions 2/);
    expect(admitSession(0, 0)).toMatchObject({ ok: false, message: expect.stringContaining('disabled') });
  });
});

describe('sessionSettings', () => {
  const d = { cellTimeoutS: 30, maxTimeoutS: 120 };
  it('applies the defaults', () => {
    expect(sessionSettings({}, d)).toEqual({ idleTimeoutS: 300, maxLifetimeS: 3600, cellTimeoutS: 30 });
    expect(sessionSettings({}, { cellTimeoutS: 600, maxTimeoutS: 120 }).cellTimeoutS).toBe(120);
  });
  it.each([
    [{ idle_timeout: 0 }, /idle_timeout/],
    [{ idle_timeout: 3601 }, /idle_timeout must be an integer between 1 and 3600/],
    [{ max_lifetime: 86401 }, /max_lifetime/],
    [{ max_lifetime: 1.5 }, /max_lifetime/],
    [{ timeout: 121 }, /timeout must be an integer between 1 and 120/],
  ])('refuses %j', (req, msg) => {
    expect(() => sessionSettings(req, d)).toThrow(msg);
  });
  it('accepts the bounds themselves', () => {
    expect(sessionSettings({ idle_timeout: 3600, max_lifetime: 86400, timeout: 120 }, d)).toEqual({ idleTimeoutS: 3600, maxLifetimeS: 86400, cellTimeoutS: 120 });
  });
});

describe('afterCell', () => {
  it.each([
    [null, { status: 'ready', endReason: null }],
    ['oom', { status: 'ended', endReason: 'oom' }],
    ['crashed', { status: 'ended', endReason: 'crashed' }],
    ['closed', { status: 'ended', endReason: 'crashed' }],
  ] as const)('sandbox %s', (ended, want) => {
    expect(afterCell(ended)).toEqual(want);
  });
});

describe('decideOrphanAction (sandboxes that outlive their owner are adopted)', () => {
  const now = sec(100);
  const o = (over: Partial<Parameters<typeof decideOrphanAction>[0]> = {}) => ({ status: 'ready' as const, heartbeatAt: sec(95), released: false, ownerAlive: false, ...over });
  it.each([
    ['released at a graceful stop: adopted at once', o({ released: true }), true, 'adopt'],
    ['released, but this runtime cannot adopt', o({ released: true, heartbeatAt: sec(0) }), false, 'service_restart'],
    ['owner silent past staleMs: adopted', o({ heartbeatAt: sec(80) }), true, 'adopt'],
    ['owner silent past staleMs, local runtime: service_restart', o({ heartbeatAt: sec(80) }), false, 'service_restart'],
    ['owner silent, but its lease is live: left alone', o({ heartbeatAt: sec(0), ownerAlive: true }), true, null],
    ['owner heard from recently: left alone', o(), true, null],
    ['ended: nothing', o({ status: 'ended' as never, released: true }), true, null],
  ] as const)('%s', (_n, input, canAdopt, want) => {
    expect(decideOrphanAction(input, now, 10_000, canAdopt)).toBe(want);
  });
});
