/**
 * Issue 23 item 2: `network: none` job types can run under a second RuntimeClass whose runsc handler
 * has `--network=none`, so "no network" does not rest on NetworkPolicy alone. The choice is a pure
 * function of the job type's network, the class the run would get and the config; every path that
 * builds a run pod (cold Job, warm pool Job, cold-attach Job) goes through buildJob and gets it.
 */
import { describe, expect, it } from 'vitest';
import * as v from 'valibot';
import { JobTypeConfigSchema, parseConfig } from '../../../../src/config.ts';
import { fromConfig } from '../../../../src/jobtypes/job-type.ts';
import { buildJob, runtimeClassForRun } from '../../../../src/runtime/kubernetes/runs/build-job.ts';
import { coldAttachJob, poolJob } from '../../../../src/runtime/kubernetes/pool/pool-plan.ts';
import type { RunSpec } from '../../../../src/runtime/runtime.ts';

const cfg = (none: string | null) => parseConfig({ runtime: 'kubernetes', kubernetes: { executor_image: 'reg/exec:1', runtime_class_network_none: none } }, {});
const jt = (o: Record<string, unknown> = {}) => fromConfig(v.parse(JobTypeConfigSchema, { name: 'default', ...o }));
const noneType = jt();
const bridgeType = jt({ name: 'http', network: { mode: 'bridge' } });
const spec = (jobType = noneType): RunSpec => ({
  executionId: '3f2b8c1e-6a0d-4e7b-9f35-0c1d2e3f4a5b',
  code: 'print(1)\n',
  inputJson: '{}',
  jobType,
  timeoutSec: 30,
  startupTimeoutSec: 60,
  requirements: [],
  maxStdoutBytes: 1024,
  maxArtifactBytes: 1024,
});

describe('runtimeClassForRun', () => {
  it.each([
    // network, class the run would get, runtime_class_network_none, expected
    ['none', 'gvisor', 'gvisor-nonet', 'gvisor-nonet'],
    ['none', 'gvisor', null, 'gvisor'],
    ['bridge', 'gvisor', 'gvisor-nonet', 'gvisor'],
    ['bridge', 'gvisor', null, 'gvisor'],
    // permissive without gVisor: the run gets no class, and neither does it get the runsc-based one
    ['none', null, 'gvisor-nonet', null],
    ['bridge', null, 'gvisor-nonet', null],
  ] as const)('network %s, base %s, network-none class %s → %s', (network, base, none, want) => {
    expect(runtimeClassForRun(network, base, cfg(none))).toBe(want);
  });
});

describe('every run-pod builder uses it', () => {
  const rc = (job: { spec?: { template: { spec?: { runtimeClassName?: string } } } }) => job.spec!.template.spec!.runtimeClassName;

  it('cold Job, pool Job and cold-attach Job of a network none type get the network-none class', () => {
    const c = cfg('gvisor-nonet');
    expect(rc(buildJob(spec(), noneType, c, { runtimeClassName: 'gvisor', sources: 'sandpod-runner-test' }).job)).toBe('gvisor-nonet');
    expect(rc(poolJob(noneType, c, { runtimeClassName: 'gvisor', sources: 'cm', name: 'p', maxIdleSec: 60 }).job)).toBe('gvisor-nonet');
    expect(rc(coldAttachJob(spec(), c, { runtimeClassName: 'gvisor', sources: 'cm-', name: 'c', graceSec: 5 }))).toBe('gvisor-nonet');
  });

  it('bridge types keep the ordinary class on every path', () => {
    const c = cfg('gvisor-nonet');
    expect(rc(buildJob(spec(bridgeType), bridgeType, c, { runtimeClassName: 'gvisor', sources: 'sandpod-runner-test' }).job)).toBe('gvisor');
    expect(rc(poolJob(bridgeType, c, { runtimeClassName: 'gvisor', sources: 'cm', name: 'p', maxIdleSec: 60 }).job)).toBe('gvisor');
    expect(rc(coldAttachJob(spec(bridgeType), c, { runtimeClassName: 'gvisor', sources: 'cm-', name: 'c', graceSec: 5 }))).toBe('gvisor');
  });

  it('unset, nothing changes: every type keeps the one class', () => {
    expect(rc(buildJob(spec(), noneType, cfg(null), { runtimeClassName: 'gvisor', sources: 'sandpod-runner-test' }).job)).toBe('gvisor');
  });
});
