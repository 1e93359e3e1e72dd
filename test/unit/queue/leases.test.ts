/** Who counts as a dead holder of a running record: the pure rule, on the database's clock only. */
import { describe, expect, it } from 'vitest';
import { judgeHolder, type HolderFacts } from '../../../src/queue/leases.ts';

const LEASE = 30_000;
const now = new Date('2026-01-01T12:00:00.000Z');
const at = (msFromNow: number) => new Date(now.getTime() + msFromNow);
const facts = (over: Partial<HolderFacts>): HolderFacts => ({ holder: 'pod-a/1/n', leaseExpiresAt: at(20_000), heartbeatAt: at(0), dbNow: now, deadHere: false, ...over });

describe('judgeHolder', () => {
  it.each([
    { name: 'a live lease', f: facts({}), verdict: 'alive' },
    {
      name: 'a live lease and a per-run heartbeat a minute old (the old rule said dead after 10 s: a CPU-starved replica)',
      f: facts({ heartbeatAt: at(-60_000), leaseExpiresAt: at(1) }),
      verdict: 'alive',
    },
    { name: 'a lease that expires exactly now', f: facts({ leaseExpiresAt: at(0) }), verdict: 'lease_expired' },
    { name: 'a lease expired a moment ago, heartbeat fresh (by the holder’s own clock)', f: facts({ leaseExpiresAt: at(-1), heartbeatAt: at(5_000) }), verdict: 'lease_expired' },
    { name: 'no holder at all', f: facts({ holder: null }), verdict: 'unheld' },
    { name: 'a process of this host that is gone, lease still live', f: facts({ deadHere: true }), verdict: 'gone' },
    { name: 'no lease row (a process from before leases), heartbeat recent', f: facts({ leaseExpiresAt: null, heartbeatAt: at(-(LEASE - 1)) }), verdict: 'alive' },
    { name: 'no lease row, heartbeat a whole lease old', f: facts({ leaseExpiresAt: null, heartbeatAt: at(-LEASE) }), verdict: 'silent' },
    { name: 'no lease row, never heartbeated', f: facts({ leaseExpiresAt: null, heartbeatAt: null }), verdict: 'silent' },
    { name: 'no lease row, heartbeat in the future (a holder clock ahead)', f: facts({ leaseExpiresAt: null, heartbeatAt: at(3_600_000) }), verdict: 'alive' },
  ])('$name → $verdict', ({ f, verdict }) => {
    expect(judgeHolder(f, LEASE)).toBe(verdict);
  });

  it('only the database clock counts: the same facts read later turn the verdict', () => {
    const f = facts({ leaseExpiresAt: at(10_000) });
    expect(judgeHolder(f, LEASE)).toBe('alive');
    expect(judgeHolder({ ...f, dbNow: at(9_999) }, LEASE)).toBe('alive');
    expect(judgeHolder({ ...f, dbNow: at(10_000) }, LEASE)).toBe('lease_expired');
  });
});
