/**
 * A service stop says where it is (`stopStep()`): a stop that hangs names the step it waits on, so a
 * shutdown stuck on the runtime or the database is told apart (test/support/service.ts prints it
 * when a test service's stop takes long).
 */
import { describe, expect, it } from 'vitest';
import { startTestService } from '../../support/service.ts';

describe('service stop steps', () => {
  it('are null before the stop, name the runtime while its stop is held, and null again once it returned', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let runtimeStops = 0;
    const svc = await startTestService(
      { dispatch: false },
      {
        runtime: async (real) => {
          const r = await real();
          const stop = r.stop.bind(r);
          r.stop = async () => {
            runtimeStops++;
            await held;
            await stop();
          };
          return r;
        },
      },
    );
    expect(svc.stopStep()).toBeNull();
    const stopping = svc.stop(1000);
    const deadline = Date.now() + 10_000;
    while (svc.stopStep() !== 'runtime' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    expect(svc.stopStep()).toBe('runtime');
    // Held there: nothing after the runtime (the database) has begun.
    await new Promise((r) => setTimeout(r, 100));
    expect(svc.stopStep()).toBe('runtime');
    expect(runtimeStops).toBe(1);
    release();
    await stopping;
    expect(svc.stopStep()).toBeNull();
    // Stopped already (close() would stop it again): only its database is left.
    await svc.database.drop();
  });
});
