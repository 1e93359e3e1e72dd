import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Sandboxes and databases are real; keep the 2-core machine from thrashing.
    fileParallelism: true,
    maxWorkers: 2,
    // Under CI a failed test runs once more before it fails the build: the suite starts real sandboxes,
    // databases and processes on a 2-core machine, where a timing bound can lose to a load spike. A test
    // that fails twice still fails; vitest's report names every test that needed the second try.
    retry: process.env.CI ? 1 : 0,
    globalSetup: ['test/support/global-setup.ts'],
  },
});
