/**
 * Sandbox suites run once per real engine. Where an engine is missing they skip visibly, except in
 * CI (`CI=true`), which installs both: there a missing engine is a failure, not a silent skip.
 */
import { describe, expect, it } from 'vitest';
import { engineInstalled, findEngineBinaries } from '../../src/runtime/local/engines.ts';

/** The real engines the sandbox suites cover. */
export const REAL_ENGINES = ['gvisor', 'bubblewrap'] as const;

/** `describe.each` over the real engines, with the presence check above; `body` gets the engine. */
export function describeEachEngine(title: string, body: (engine: (typeof REAL_ENGINES)[number]) => void): void {
  describe.each(REAL_ENGINES)(title, (engine) => {
    const installed = engineInstalled(engine, findEngineBinaries({ container_runtime: 'runsc' }));
    if (!installed && process.env.CI === 'true') {
      it(`${engine} is installed (CI installs it from .ci/apt-packages.txt)`, () => {
        expect(installed, `${engine} is missing`).toBe(true);
      });
      return;
    }
    describe.skipIf(!installed)(`(${engine} ${installed ? 'present' : 'NOT INSTALLED: skipped'})`, () => body(engine));
  });
}
