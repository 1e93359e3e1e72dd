/**
 * Pool pods of every kind against the fake API server, whose warm pods run the real runner and the
 * real deliver.py (issue 18 item 4): an `allowed_hosts` type is pooled and each run's proxy
 * credential reaches the program on its go line, never in the pod spec; a type's `preload` modules
 * are imported before the program arrives, and one that fails there is skipped.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { verifyEgressToken } from '../../../src/egress/token.ts';
import type { JobType } from '../../../src/jobtypes/job-type.ts';
import { POOL_LABELS } from '../../../src/runtime/kubernetes/pool/pool-plan.ts';
import { LABELS } from '../../../src/runtime/kubernetes/names.ts';
import type { Runtime } from '../../../src/runtime/runtime.ts';
import { RUNNER_PATH } from '../../../src/sandbox/paths.ts';
import { FakeKube, jobType, spec, startRuntime, testConfig } from '../../support/kube-runtime.ts';

const NS = 'sandpod-jobs';
const KEY = 'k'.repeat(48);
const runnerSource = readFileSync(RUNNER_PATH, 'utf8');
let fake: FakeKube;
let rt: Runtime | null = null;

async function start(types: JobType[]): Promise<Runtime> {
  const keyFile = path.join(mkdtempSync(path.join(tmpdir(), 'wpk-')), 'key');
  writeFileSync(keyFile, KEY);
  rt = await startRuntime(fake, {
    config: testConfig({ kubernetes: { executor_image: 'sandpod/executor:test', deadline_grace_seconds: 5, preflight: false, warm_pool_size: 1, egress_proxy: { url: 'http://10.96.0.50:3128', key_file: keyFile } } }),
    options: { runnerSource, jobTypes: () => types, tuning: { podGoneGraceMs: 150, execTimeoutMs: 5000, informerBackoffInitialMs: 20, informerBackoffMaxMs: 200, healthCacheMs: 0, poolIntervalMs: 50 } },
  });
  return rt;
}

/** Waits until the pool itself counts a ready pod of the type (main and collector running). */
async function poolReady(runtime: Runtime, jobTypeName: string): Promise<void> {
  await fake.waitFor(() => (runtime.warmPoolStats!().find((x) => x.job_type === jobTypeName)?.ready ?? 0) >= 1, 15_000, `a ready pool pod of ${jobTypeName}`);
}

beforeEach(async () => {
  fake = await FakeKube.start({ runWarmPods: true, schedulePods: true });
  fake.addRuntimeClass('gvisor');
});
afterEach(async () => {
  await rt?.stop();
  rt = null;
  await fake.close();
});

describe('pool pods of every kind (fake API server, real runner)', () => {
  it('allowed_hosts: pooled; each run gets its own proxy credential at the claim, none is in the pod spec', async () => {
    const web = jobType({ name: 'web', network: { mode: 'bridge', allowed_hosts: ['example.com'] } });
    const runtime = await start([web]);
    const code = 'import os\nprint(os.environ.get("HTTP_PROXY"), os.environ.get("https_proxy") == os.environ.get("HTTP_PROXY"))';
    const seen: string[] = [];
    for (let i = 0; i < 2; i++) {
      await poolReady(runtime, 'web');
      const s = spec({ jobType: web, code });
      const raw = await runtime.run(s);
      expect(raw.observation).toMatchObject({ exitCode: 0, infraError: null });
      const [url, same] = raw.stdout.trim().split(' ');
      expect(same).toBe('True');
      // The run's own grant: its execution id and hosts, signed with the proxy's key.
      const token = decodeURIComponent(new URL(url!).password || new URL(url!).username);
      const verdict = verifyEgressToken(token, KEY, Date.now());
      expect(verdict).toMatchObject({ grant: { executionId: s.executionId, allowedHosts: ['example.com'] } });
      expect(new URL(url!).host).toBe('10.96.0.50:3128');
      seen.push(url!);
      // Claimed from the pool (not cold), and the pod was made without any credential.
      const job = fake.list('jobs', NS).find((j) => j.metadata.labels?.[LABELS.executionId] === s.executionId)!;
      expect(job.metadata.labels?.[POOL_LABELS.pool]).toBe('web');
      expect(job.spec.template.metadata.labels['sandpod.io/egress']).toBe('proxy');
      const main = job.spec.template.spec.containers.find((c: { name: string }) => c.name === 'main');
      expect(main.command.some((a: string) => /^(HTTPS?_PROXY|https?_proxy|ALL_PROXY)=/.test(a))).toBe(false);
      expect(JSON.stringify(job)).not.toContain(token);
    }
    expect(seen[0]).not.toBe(seen[1]);
    expect(runtime.warmPoolStats!().find((x) => x.job_type === 'web')).toMatchObject({ hits: 2, misses: 0 });
  });

  it('preload: the modules are imported before the program arrives; a missing one is skipped and the program gets the real error', async () => {
    const pre = jobType({ name: 'pre', preload: ['json', 'no_such_module_sandpod'] });
    const runtime = await start([pre]);
    await poolReady(runtime, 'pre');
    const raw = await runtime.run(spec({ jobType: pre, code: 'import sys\nprint("json" in sys.modules)\nimport no_such_module_sandpod' }));
    expect(raw.stdout).toBe('True\n');
    expect(raw.observation.exitCode).toBe(1);
    expect(raw.report?.exception).toBe('ModuleNotFoundError');
  });
});
