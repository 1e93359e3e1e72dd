/**
 * Debian's own Python packages in the sandbox (issue 23 item 5): python3-numpy finds its BLAS through
 * the alternatives links in /etc (libblas.so.3 → /etc/alternatives/… → /usr/lib/…/blas/), so the
 * sandbox's /etc must carry them (and ld.so.cache), read-only. Skipped only where the Debian packages
 * are not installed.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig, type Config } from '../../../src/config.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import type { EngineName } from '../../../src/runtime/local/engines.ts';
import { createLocalRuntime, type LocalRuntime } from '../../../src/runtime/local/index.ts';
import { describeEachEngine } from '../../support/engines.ts';

const NUMPY = existsSync('/usr/lib/python3/dist-packages/numpy');
const PANDAS = existsSync('/usr/lib/python3/dist-packages/pandas');

describeEachEngine('Debian python3 packages on %s', (engine: EngineName) => {
  let config: Config;
  let rt: LocalRuntime;
  beforeAll(async () => {
    const workspace = mkdtempSync(path.join('/tmp/sandpod-test', `ws-deb-${engine}-`));
    config = parseConfig({ workspace, sandbox_engine: engine, warm_pool: { sizes: {} } }, {});
    rt = createLocalRuntime(config);
    await rt.start();
  });
  afterAll(async () => {
    await rt?.stop();
  });

  const run = (code: string) =>
    rt.run({
      executionId: `t-${Math.random().toString(36).slice(2)}`,
      code,
      inputJson: '{}',
      jobType: new FileJobTypeRegistry(config).get('default')!,
      timeoutSec: 60,
      startupTimeoutSec: 60,
      requirements: [],
      maxStdoutBytes: 32768,
      maxArtifactBytes: 1024 * 1024,
    });

  it.skipIf(!NUMPY)('imports numpy (python3-numpy) and computes with it', async () => {
    const r = await run('import numpy\nprint(numpy.ones(3).sum())\n');
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('3.0\n');
    expect(r.observation.exitCode).toBe(0);
  });

  it.skipIf(!PANDAS)('imports pandas (python3-pandas)', async () => {
    const r = await run('import pandas\nprint(int(pandas.Series([1, 2, 3]).sum()))\n');
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('6\n');
  });

  it('sees only the allowed parts of the host /etc: alternatives and ld.so.cache read-only, no passwd or shadow of the host', async () => {
    const r = await run(
      [
        'import os',
        "print(os.path.isdir('/etc/alternatives'), os.path.exists('/etc/ld.so.cache'))",
        "print(os.path.exists('/etc/shadow'), os.path.exists('/etc/pip.conf'), open('/etc/passwd').read().count('\\n'))",
        'try:',
        "    open('/etc/alternatives/sandpod-test', 'w')",
        "    print('writable')",
        'except OSError as e:',
        "    print('refused')",
      ].join('\n'),
    );
    expect(r.stderr).toBe('');
    const host = (p: string) => (existsSync(p) ? 'True' : 'False');
    expect(r.stdout).toBe(`${host('/etc/alternatives')} ${host('/etc/ld.so.cache')}\nFalse False 3\nrefused\n`);
  });
});
