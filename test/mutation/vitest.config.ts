/**
 * The vitest configuration Stryker runs under `make mutation`: the project's own, restricted to the
 * test files of one module (`SANDPOD_MUTATION_TESTS`, comma-separated globs, set by stryker.config.mjs).
 * (Not vite's mergeConfig: it concatenates arrays, which would keep the whole suite's `include`.)
 */
import path from 'node:path';
import { defineConfig } from 'vitest/config';
import base from '../../vitest.config.ts';

const tests = (process.env.SANDPOD_MUTATION_TESTS ?? '').split(',').filter(Boolean);
if (tests.length === 0) throw new Error('SANDPOD_MUTATION_TESTS is empty: run through `make mutation MODULE=…`');

export default defineConfig({
  ...base,
  root: path.resolve(import.meta.dirname, '../..'),
  test: { ...base.test, include: tests },
});
