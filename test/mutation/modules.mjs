/**
 * The modules `make mutation` covers: each maps to the source files Stryker mutates and the test files
 * that cover them, so that one module's run takes minutes (the whole suite per mutant would take
 * hours). Read by stryker.config.mjs (which module: `MODULE=name`) and by test/mutation/vitest.config.ts
 * (which test files: the `SANDPOD_MUTATION_TESTS` it is handed).
 */
export const MODULES = {
  classify: { mutate: ['src/executions/classify.ts'], tests: ['test/unit/executions/classify.test.ts'] },
  resilience: { mutate: ['src/resilience/*.ts'], tests: ['test/unit/resilience/*.test.ts'] },
  decide: { mutate: ['src/runtime/kubernetes/decide.ts'], tests: ['test/unit/runtime/kubernetes/decide.test.ts'] },
  'request-context': { mutate: ['src/api/middleware/request-context.ts'], tests: ['test/unit/api/request-context.test.ts'] },
  'egress-proxy': { mutate: ['src/runtime/local/egress-proxy.ts'], tests: ['test/unit/runtime/local/egress-proxy.test.ts'] },
  claims: {
    mutate: ['src/queue/claims.ts'],
    tests: ['test/unit/queue/dispatcher.test.ts', 'test/integration/store/shutdown-requeue.test.ts', 'test/integration/store/orphans-breaker.test.ts', 'test/integration/api/async.test.ts'],
  },
  submission: {
    mutate: ['src/executions/submission.ts'],
    tests: ['test/integration/store/idempotency-race.test.ts', 'test/integration/api/async.test.ts', 'test/integration/api/execute.test.ts'],
  },
  repositories: {
    mutate: ['src/store/*.repository.ts'],
    tests: [
      'test/integration/store/executions.test.ts',
      'test/integration/store/pagination.test.ts',
      // Not store/history.test.ts: it seeds 60,000 rows per run, minutes per mutant; pagination covers the list.
      'test/integration/executions/history.test.ts',
      'test/integration/store/idempotency-race.test.ts',
    ],
  },
};
