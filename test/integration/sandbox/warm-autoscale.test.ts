/**
 * Pool sizes that follow demand (warm_pool.autoscale, issue 18) on a real engine: the refill time is
 * measured and shown; an idle job type goes to zero sandboxes; a claim (a miss) brings it back. The
 * sizing decisions themselves are table-tested with an injected clock (pool-sizing.test.ts).
 */
import { mkdtempSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import { describeEachEngine } from '../../support/engines.ts';

const asRoot = process.getuid?.() === 0;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describeEachEngine('warm pool sizes following demand on %s', (engine) => {
  let config: Config;
  let rt: LocalRuntime;
  beforeAll(async () => {
    const workspace = mkdtempSync(path.join('/tmp/sandpod-test', `wa-${engine.slice(0, 2)}-`));
    config = parseConfig({ workspace, sandbox_engine: engine, warm_pool: { sizes: { default: 1 }, max_idle_sec: 6, autoscale: { enabled: true, window_sec: 30 } } }, {});
    rt = createLocalRuntime(config);
    await rt.start();
  });
  afterAll(async () => {
    await rt?.stop();
  });
  const stat = () => rt.warmPoolStats().find((s) => s.job_type === 'default')!;
  const until = async (pred: () => boolean, ms = 60_000) => {
    for (let t = 0; t < ms && !pred(); t += 100) await sleep(100);
  };

  it.skipIf(!asRoot)('shows the measured refill time, goes to zero when idle, and comes back on demand', async () => {
    await until(() => stat().ready === 1);
    expect(stat()).toMatchObject({ target: 1, ready: 1 });
    expect(stat().refill_ms).toBeGreaterThan(0);
    // No claim for max_idle_sec (6 s): the target and the pool go to zero.
    await until(() => stat().target === 0 && stat().ready + stat().starting === 0, 60_000);
    expect(stat()).toMatchObject({ target: 0, ready: 0, starting: 0 });
    const spec = {
      executionId: 't-autoscale',
      code: 'print(7)\n',
      inputJson: '{}',
      jobType: new FileJobTypeRegistry(config).get('default')!,
      timeoutSec: 30,
      startupTimeoutSec: 60,
      requirements: [],
      maxStdoutBytes: 32768,
      maxArtifactBytes: 1024 * 1024,
    };
    const misses = stat().misses;
    const r = await rt.run(spec);
    expect(r.stdout).toBe('7\n');
    expect(stat().misses).toBe(misses + 1);
    // The miss is demand: the key is kept warm again.
    await until(() => stat().ready === 1);
    expect(stat()).toMatchObject({ target: 1, ready: 1 });
  }, 180_000);
});
