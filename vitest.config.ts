import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Sandboxes and databases are real; keep the 2-core machine from thrashing.
    fileParallelism: true,
    maxWorkers: 2,
    globalSetup: ['test/support/global-setup.ts'],
  },
});
