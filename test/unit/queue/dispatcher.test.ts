/**
 * Dispatcher stop with every worker slot busy: the grace period must start at once — not when a run
 * happens to end and frees the slot the serving loop was waiting for.
 */
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/logger.ts';
import { Dispatcher } from '../../../src/queue/dispatcher.ts';
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
