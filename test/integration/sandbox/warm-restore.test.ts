/**
 * Warm gVisor sandboxes restored from a checkpoint (issue 18 item 3; pool/restore-images.ts), on real
 * runsc, nothing mocked: the first sandbox of a key is booted and checkpointed, the others are
 * restored from its image, each with its own identity (container, run directory, random sequences),
 * its preloads done, and never shared. The escape, limits, fd and never-reuse suites run on restored
 * sandboxes too (test/support/engines.ts, mode `restored`).
 */
import { existsSync, mkdirSync, mkdtempSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry, type JobType } from '../../../src/jobtypes/job-type.ts';
import { engineInstalled, findEngineBinaries } from '../../../src/runtime/local/engines.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import type { RunSpec } from '../../../src/runtime/runtime.ts';

const asRoot = process.getuid?.() === 0;
const gvisor = engineInstalled('gvisor', findEngineBinaries({ container_runtime: 'runsc' }));
const NUMPY = existsSync('/usr/lib/python3/dist-packages/numpy');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What a restored sandbox's program reports of itself. */
const IDENTITY = `
import json, os, random, sys
doc = {
    'preloaded': [m for m in ('json', 'numpy') if m in sys.modules],
    'random': random.random(),
    'numpy': __import__('numpy').random.rand() if 'numpy' in sys.modules else None,
    'urandom': os.urandom(8).hex(),
    'tmp_before': sorted(os.listdir('/tmp')),
    'output_before': sorted(n for n in os.listdir('/output') if not n.startswith('.svc_')),
}
open('/tmp/mine', 'w').write('x')
open('/output/mine.txt', 'w').write(doc['urandom'])
for p in ('/code/main.py', '/input/data.json'):
    try:
        open(p, 'a').write('#')
        doc[p] = 'WRITABLE'
    except OSError as e:
        doc[p] = type(e).__name__
print(json.dumps(doc))
`;

describe.skipIf(!gvisor || !asRoot)('warm sandboxes restored from a checkpoint (gVisor)', () => {
  let config: Config;
  let rt: LocalRuntime;
  beforeAll(async () => {
    mkdirSync('/tmp/sandpod-test', { recursive: true });
    const workspace = mkdtempSync(path.join('/tmp/sandpod-test', 'restore-'));
    config = parseConfig(
      {
        workspace,
        sandbox_engine: 'gvisor',
        warm_pool: { sizes: {}, restore: true, max_idle_sec: 300 },
        job_types: [{ name: 'frames', preload: NUMPY ? ['json', 'numpy'] : ['json'], memory_limit: '1g', timeout: 60 }],
      },
      {},
    );
    rt = createLocalRuntime(config);
    await rt.start();
  }, 120_000);
  afterAll(async () => {
    await rt?.stop();
  });

  const jt = (): JobType => new FileJobTypeRegistry(config).get('frames')!;
  const spec = (code: string): RunSpec => ({
    executionId: `t-${Math.random().toString(36).slice(2)}`,
    code,
    inputJson: '{}',
    jobType: jt(),
    timeoutSec: 60,
    startupTimeoutSec: 120,
    requirements: [],
    maxStdoutBytes: 32768,
    maxArtifactBytes: 1024 * 1024,
  });
  const stat = () => rt.warmPoolStats().find((s) => s.job_type === 'frames');

  it('boots one template per key, then restores each sandbox: preloads done, its own random sequences, read-only /code and /input, nothing of another run', async () => {
    await rt.prewarm(jt(), 2);
    for (let i = 0; i < 600 && (stat()?.ready ?? 0) < 2; i++) await sleep(100);
    expect(stat()).toMatchObject({ ready: 2 });
    // Both ready sandboxes were restored (the template was checkpointed, and stopped).
    expect(stat()!.restored).toBe(2);
    const before = stat()!.hits;
    const [a, b] = await Promise.all([rt.run(spec(IDENTITY)), rt.run(spec(IDENTITY))]);
    expect(stat()!.hits).toBe(before + 2);
    const [da, db] = [a, b].map((r) => {
      expect(r.stderr).toBe('');
      expect(r.observation.exitCode).toBe(0);
      return JSON.parse(r.stdout) as Record<string, unknown>;
    });
    for (const d of [da!, db!]) {
      expect(d.preloaded).toEqual(NUMPY ? ['json', 'numpy'] : ['json']);
      expect(d.tmp_before).toEqual([]);
      expect(d.output_before).toEqual([]);
      expect(d['/code/main.py']).not.toBe('WRITABLE');
      expect(d['/input/data.json']).not.toBe('WRITABLE');
    }
    // Copies of one checkpointed interpreter, yet no shared sequence: the runner reseeds at the go.
    expect(da!.random).not.toBe(db!.random);
    if (NUMPY) expect(da!.numpy).not.toBe(db!.numpy);
    expect(da!.urandom).not.toBe(db!.urandom);
    // Each run's artifact is its own.
    expect(a!.artifacts.map((f) => f.name)).toEqual(['mine.txt']);
    expect(b!.artifacts.map((f) => f.name)).toEqual(['mine.txt']);
  }, 300_000);

  it('refills from the image: the sandboxes that replace the claimed ones are restored too, and one image serves the key', async () => {
    for (let i = 0; i < 600 && ((stat()?.ready ?? 0) < 2 || (stat()?.restored ?? 0) < 4); i++) await sleep(100);
    expect(stat()).toMatchObject({ ready: 2, restored: 4 });
    const r = await rt.run(spec('print(6 * 7)'));
    expect(r.stdout).toBe('42\n');
    expect(r.observation.warm).toBe(true);
  }, 300_000);
});
