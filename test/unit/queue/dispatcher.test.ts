/**
 * Dispatcher stop with every worker slot busy: the grace period must start at once — not when a run
 * happens to end and frees the slot the serving loop was waiting for.
 */
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/logger.ts';
import { Dispatcher, dispatchGate, type DispatchGate } from '../../../src/queue/dispatcher.ts';
import { Slots } from '../../../src/queue/slots.ts';

describe('Dispatcher.stop', () => {
  it('with all slots busy: gives up after the grace, then drains once the runs end', async () => {
    let finish!: () => void;
    const running = new Promise<void>((r) => (finish = r));
    let claims = 0;
    const slots = new Slots(1);
    const d = new Dispatcher<string>({
      slots,
      logger: silentLogger,
      pollMs: 10,
      target: {
        claim: async () => (claims++ === 0 ? 'job-1' : undefined),
        execute: () => running,
      },
    });
    await d.start();
    // The run holds the only slot and the serving loop waits for it.
    while (slots.waiting === 0) await new Promise((r) => setTimeout(r, 5));
    expect(slots.busy).toBe(1);
    const t0 = Date.now();
    expect(await d.stop(100)).toBe(false);
    expect(Date.now() - t0).toBeLessThan(1000);
    finish();
    await d.drained();
    expect(slots.busy).toBe(0);
    expect(claims).toBe(1);
  });

  it('with nothing running: stops at once and reports done', async () => {
    const slots = new Slots(2);
    const d = new Dispatcher<string>({ slots, logger: silentLogger, pollMs: 10, target: { claim: async () => undefined, execute: async () => {} } });
    await d.start();
    expect(await d.stop(10_000)).toBe(true);
    expect(slots.busy).toBe(0);
  });
});

describe('dispatchGate', () => {
  it.each([
    { state: 'closed', retry: 0, want: { kind: 'go' } },
    { state: 'open', retry: 12_000, want: { kind: 'wait', ms: 12_000 } },
    { state: 'open', retry: 0, want: { kind: 'wait', ms: 50 } },
    { state: 'half_open', retry: 0, want: { kind: 'probe' } },
  ] as const)('$state → $want.kind', ({ state, retry, want }) => {
    expect(dispatchGate(state, retry)).toEqual(want);
  });
});

describe('Dispatcher with a gate', () => {
  it('claims nothing while the gate says wait, one job at a time while it says probe, all once it says go', async () => {
    let gate: DispatchGate = { kind: 'wait', ms: 20 };
    let claims = 0;
    const finishers: (() => void)[] = [];
    const slots = new Slots(3);
    const d = new Dispatcher<number>({
      slots,
      logger: silentLogger,
      pollMs: 10,
      gate: () => gate,
      target: {
        claim: async () => ++claims,
        execute: () => new Promise<void>((r) => finishers.push(r)),
      },
    });
    await d.start();
    d.wake(); // a NOTIFY does not end the wait
    await new Promise((r) => setTimeout(r, 150));
    expect(claims).toBe(0);
    gate = { kind: 'probe' };
    await new Promise((r) => setTimeout(r, 150));
    expect(claims).toBe(1);
    finishers.shift()!();
    await new Promise((r) => setTimeout(r, 150));
    expect(claims).toBe(2);
    gate = { kind: 'go' };
    await new Promise((r) => setTimeout(r, 150));
    expect(claims).toBe(4); // three slots: the probe still running plus two more
    expect(slots.busy).toBe(3);
    for (const f of finishers.splice(0)) f();
    gate = { kind: 'wait', ms: 10_000 };
    const t0 = Date.now();
    expect(await d.stop(1000)).toBe(true);
    expect(Date.now() - t0).toBeLessThan(1000); // stop ends a long wait at once
  });

  it('a job started before the probe does not hold the probe back', async () => {
    let gate: DispatchGate = { kind: 'go' };
    let claims = 0;
    const finishers: (() => void)[] = [];
    const d = new Dispatcher<number>({
      slots: new Slots(3),
      logger: silentLogger,
      pollMs: 10,
      gate: () => gate,
      target: { claim: async () => (claims < 1 || gate.kind !== 'go' ? ++claims : undefined), execute: () => new Promise<void>((r) => finishers.push(r)) },
    });
    await d.start();
    await new Promise((r) => setTimeout(r, 100));
    expect(claims).toBe(1); // a long job, still running
    gate = { kind: 'probe' };
    await new Promise((r) => setTimeout(r, 150));
    expect(claims).toBe(2); // the probe goes although the long job runs
    finishers[0]!(); // the long job ends: the probe is still the one in flight
    await new Promise((r) => setTimeout(r, 150));
    expect(claims).toBe(2);
    finishers[1]!();
    await new Promise((r) => setTimeout(r, 150));
    expect(claims).toBe(3);
    for (const f of finishers.splice(0)) f();
    expect(await d.stop(1000)).toBe(true);
  });
});
