// @ts-check
/**
 * StrykerJS over one core module at a time (`make mutation MODULE=classify`; `make mutation` alone runs
 * them all, one after another). Modules and their tests: test/mutation/modules.mjs. Scores and the
 * survivors that remain: docs/mutation.md. Too slow for CI, so not part of `make test`.
 */
import { MODULES } from './test/mutation/modules.mjs';

const name = process.env.MODULE ?? '';
const mod = MODULES[name];
if (!mod) throw new Error(`MODULE must be one of: ${Object.keys(MODULES).join(', ')} (got '${name}')`);
// Read by test/mutation/vitest.config.ts in Stryker's test-runner processes.
process.env.SANDPOD_MUTATION_TESTS = mod.tests.join(',');

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  testRunner: 'vitest',
  plugins: ['@stryker-mutator/vitest-runner'],
  vitest: { configFile: 'test/mutation/vitest.config.ts', related: false },
  mutate: mod.mutate,
  coverageAnalysis: 'perTest',
  // Two cores are shared with databases and sandboxes.
  concurrency: Number(process.env.STRYKER_CONCURRENCY ?? 2),
  timeoutMS: 20_000,
  reporters: ['clear-text', 'progress', 'html', 'json'],
  htmlReporter: { fileName: `reports/mutation/${name}.html` },
  jsonReporter: { fileName: `reports/mutation/${name}.json` },
  tempDirName: '.stryker-tmp',
  cleanTempDir: true,
  thresholds: { high: 90, low: 80, break: null },
  // charts/sandpod/crds is a symlink to a directory, which Stryker's copy cannot take; no module's tests read it.
  ignorePatterns: ['.workspace', '.bench', 'dist', 'coverage', 'reports', 'charts/sandpod/crds'],
};
