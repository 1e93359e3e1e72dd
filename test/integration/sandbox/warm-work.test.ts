/**
 * Warm sandboxes for real work (issue 18), on real engines, nothing mocked: a job type with `preload`
 * (Debian's numpy and pandas) starts with its imports done; a job type with requirements warms from
 * its cached environment after the first (cold) run; job types with `allowed_hosts` are pooled, and a
 * claimed sandbox reaches exactly its run's hosts and none of another type's.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry, type JobType } from '../../../src/jobtypes/job-type.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import type { RunSpec } from '../../../src/runtime/runtime.ts';
import { describeEachEngine } from '../../support/engines.ts';
import { buildWheels } from '../../support/wheel.ts';

const asRoot = process.getuid?.() === 0;
const PANDAS = existsSync('/usr/lib/python3/dist-packages/pandas');

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** An HTTP server on the host's loopback answering every request with `name`. */
async function site(name: string): Promise<{ port: number; close: () => Promise<void> }> {
  const server = http.createServer((_req, res) => res.end(name));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as AddressInfo).port, close: () => new Promise((r) => server.close(() => r())) };
}

/** Fetches each URL through the run's proxy variables; prints `url status body`. */
const FETCH = `
import json, sys, urllib.request, urllib.error
for url in json.load(open('/input/data.json'))['urls']:
    try:
        r = urllib.request.urlopen(url, timeout=20)
        print(url, r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(url, e.code, 'refused')
    except Exception as e:
        print(url, 'error', type(e).__name__)
`;

describeEachEngine('warm sandboxes for real work on %s', (engine) => {
  let config: Config;
  let rt: LocalRuntime;
  let wheels: string;
  let a: Awaited<ReturnType<typeof site>>;
  let b: Awaited<ReturnType<typeof site>>;
  beforeAll(async () => {
    wheels = buildWheels([{ name: 'sandpod-warmpkg', version: '2.0.0' }]);
    a = await site('site-a');
    b = await site('site-b');
    const workspace = mkdtempSync(path.join('/tmp/sandpod-test', `ww-${engine.slice(0, 2)}-`));
    config = parseConfig(
      {
        workspace,
        sandbox_engine: engine,
        warm_pool: { sizes: { reqs: 1 }, max_idle_sec: 120 },
        pip: { no_index: true, find_links: [wheels] },
        job_types: [
          { name: 'frames', preload: ['numpy', 'pandas'], memory_limit: '1g', timeout: 60 },
          { name: 'reqs', requirements: ['sandpod-warmpkg'], timeout: 60 },
          { name: 'to-a', network: { mode: 'bridge', allowed_hosts: [`127.0.0.1:${a.port}`] } },
          { name: 'to-b', network: { mode: 'bridge', allowed_hosts: [`127.0.0.1:${b.port}`] } },
        ],
      },
      {},
    );
    rt = createLocalRuntime(config);
    await rt.start();
  }, 120_000);
  afterAll(async () => {
    await rt?.stop();
    await a?.close();
    await b?.close();
  });

  const jt = (name: string): JobType => new FileJobTypeRegistry(config).get(name)!;
  const spec = (jobType: JobType, code: string, over: Partial<RunSpec> = {}): RunSpec => ({
    executionId: `t-${Math.random().toString(36).slice(2)}`,
    code,
    inputJson: '{}',
    jobType,
    timeoutSec: 60,
    startupTimeoutSec: 120,
    requirements: [...jobType.requirements],
    maxStdoutBytes: 32768,
    maxArtifactBytes: 1024 * 1024,
    ...over,
  });
  const stat = (name: string) => rt.warmPoolStats().find((s) => s.job_type === name);

  it.skipIf(!asRoot || !PANDAS)('a preload type: the warm run finds numpy and pandas imported before its first line', async () => {
    await rt.prewarm(jt('frames'));
    const before = stat('frames')?.hits ?? 0;
    const r = await rt.run(spec(jt('frames'), "import sys\nprint('pandas' in sys.modules, 'numpy' in sys.modules)\nimport pandas as pd\nprint(pd.DataFrame({'a': [1, 2]}).a.sum())\n"));
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('True True\n3\n');
    expect(stat('frames')!.hits).toBe(before + 1);
  }, 120_000);

  it.skipIf(!asRoot)('a type with requirements: cold the first time (installs), then warm from the cached environment', async () => {
    const code = 'import sandpod_warmpkg\nprint(sandpod_warmpkg.VALUE)\n';
    const first = await rt.run(spec(jt('reqs'), code));
    expect(first.stdout).toBe('sandpod-warmpkg-2.0.0\n');
    expect(first.observation.warm).toBe(false);
    expect(stat('reqs')!.misses).toBeGreaterThanOrEqual(1);
    // The pool learned the environment's key from that miss and starts a sandbox with it.
    for (let i = 0; i < 600 && (stat('reqs')?.ready ?? 0) < 1; i++) await sleep(100);
    expect(stat('reqs')!.ready).toBe(1);
    const hits = stat('reqs')!.hits;
    const second = await rt.run(spec(jt('reqs'), code));
    expect(second.stdout).toBe('sandpod-warmpkg-2.0.0\n');
    expect(second.observation.depInstallMs ?? 0).toBe(0);
    expect(stat('reqs')!.hits).toBe(hits + 1);
  }, 240_000);

  it.skipIf(!asRoot)('allowed_hosts types are pooled; a claimed sandbox reaches exactly its run’s hosts, none of the other type’s', async () => {
    await rt.prewarm(jt('to-a'));
    await rt.prewarm(jt('to-b'));
    const urls = { urls: [`http://127.0.0.1:${a.port}/`, `http://127.0.0.1:${b.port}/`] };
    const hits = () => (stat('to-a')?.hits ?? 0) + (stat('to-b')?.hits ?? 0);
    const before = hits();
    const [ra, rb] = await Promise.all([rt.run(spec(jt('to-a'), FETCH, { inputJson: JSON.stringify(urls) })), rt.run(spec(jt('to-b'), FETCH, { inputJson: JSON.stringify(urls) }))]);
    expect(hits()).toBe(before + 2);
    expect(ra.stderr).toBe('');
    expect(ra.stdout).toBe(`http://127.0.0.1:${a.port}/ 200 site-a\nhttp://127.0.0.1:${b.port}/ 403 refused\n`);
    expect(rb.stdout).toBe(`http://127.0.0.1:${a.port}/ 403 refused\nhttp://127.0.0.1:${b.port}/ 200 site-b\n`);
  }, 120_000);
});
