/**
 * The modules `make mutation` covers: each maps to the source files Stryker mutates and the test files
 * that cover them, so that one module's run takes minutes (the whole suite per mutant would take
 * hours). Read by stryker.config.mjs (which module: `MODULE=name`) and by test/mutation/vitest.config.ts
 * (which test files: the `SANDPOD_MUTATION_TESTS` it is handed).
 */
export const MODULES = {
  classify: { mutate: ['src/executions/classify.ts'], tests: ['test/unit/executions/classify.test.ts', 'test/unit/executions/classify-deep.test.ts'] },
  resilience: { mutate: ['src/resilience/*.ts'], tests: ['test/unit/resilience/*.test.ts'] },
  decide: { mutate: ['src/runtime/kubernetes/runs/decide.ts'], tests: ['test/unit/runtime/kubernetes/decide.test.ts', 'test/unit/runtime/kubernetes/decide-partial.test.ts'] },
  'request-context': { mutate: ['src/api/middleware/request-context.ts'], tests: ['test/unit/api/request-context.test.ts'] },
  'egress-proxy': { mutate: ['src/egress/proxy.ts'], tests: ['test/unit/runtime/local/egress-proxy.test.ts', 'test/unit/egress/cluster-proxy.test.ts', 'test/unit/egress/proxy-edges.test.ts', 'test/unit/egress/host-bypass.test.ts', 'test/unit/egress/limits.test.ts'] },
  'egress-target': { mutate: ['src/egress/target.ts', 'src/egress/admission.ts', 'src/egress/addresses.ts'], tests: ['test/unit/egress/target.test.ts', 'test/unit/egress/limits.test.ts', 'test/unit/egress/addresses.test.ts', 'test/unit/runtime/local/egress-proxy.test.ts'] },
  claims: {
    mutate: ['src/queue/claims.ts'],
    // The direct tests of claims.ts. store/shutdown-requeue and api/async exercise it through a whole
    // service with sandboxes: tens of seconds per mutant, for nothing these do not check.
    tests: ['test/integration/store/claims.test.ts'],
  },
  submission: {
    mutate: ['src/executions/submission.ts'],
    // Its direct tests (the insert-conflict race included). store/idempotency-race and api/{async,execute}
    // go through a whole service (sandboxes for the last two): seconds to tens of seconds per mutant.
    tests: ['test/integration/executions/submission.test.ts'],
  },
  repositories: {
    mutate: ['src/store/*.repository.ts'],
    // The repositories' own tests. Not store/history.test.ts (60,000 rows seeded per run: minutes per
    // mutant), executions/history.test.ts nor store/idempotency-race.test.ts (a whole service): each
    // exercises the same functions through a layer above, for seconds more per mutant.
    tests: ['test/integration/store/repositories.test.ts', 'test/integration/store/executions.test.ts', 'test/integration/store/pagination.test.ts'],
  },
};
