/** The local builder's pure parts: the lock from pip's report, the lock file, the digest's recipe. */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as v from 'valibot';
import { afterAll, describe, expect, it } from 'vitest';
import { JobTypeConfigSchema, parseConfig } from '../../../../../src/config.ts';
import { fromConfig, type JobType } from '../../../../../src/jobtypes/job-type.ts';
import { builtEnvironmentStep, environmentDigest, LocalBuilder, lockFileText, lockFromReport, normalizeName } from '../../../../../src/runtime/local/builds/build.ts';
import { BuildFailedError } from '../../../../../src/runtime/runtime.ts';

const H1 = 'a'.repeat(64);
const H2 = 'b'.repeat(64);

function report(...items: { name: string; version: string; hash?: string; hashes?: Record<string, string> }[]) {
  return {
    version: '1',
    install: items.map((i) => ({ metadata: { name: i.name, version: i.version }, download_info: { url: 'file:///x.whl', archive_info: { ...(i.hash ? { hash: i.hash } : {}), ...(i.hashes ? { hashes: i.hashes } : {}) } } })),
  };
}

describe('normalizeName (PEP 503)', () => {
  it.each([
    ['Sandpod_BT', 'sandpod-bt'],
    ['a.b__c--d', 'a-b-c-d'],
    ['requests', 'requests'],
  ])('%s → %s', (raw, want) => expect(normalizeName(raw)).toBe(want));
});

describe('lockFromReport', () => {
  it('takes name, version and the archive sha256 (hashes first, then hash), sorted by normalized name', () => {
    const lock = lockFromReport(report({ name: 'Zeta_Pkg', version: '2.0', hash: `sha256=${H1}` }, { name: 'alpha', version: '1.0', hashes: { sha256: H2 }, hash: `sha256=${H1}` }));
    expect(lock).toEqual([
      { name: 'alpha', version: '1.0', sha256: H2 },
      { name: 'zeta-pkg', version: '2.0', sha256: H1 },
    ]);
  });

  it('a distribution without a sha256 is locked with null', () => {
    expect(lockFromReport(report({ name: 'x', version: '1', hash: 'md5=abc' }))).toEqual([{ name: 'x', version: '1', sha256: null }]);
  });

  it.each([[{}], [null], [{ install: [{ metadata: { name: 'x' } }] }]])('refuses a report without what a lock needs: %j', (r) => {
    expect(() => lockFromReport(r)).toThrow(BuildFailedError);
  });
});

describe('lockFileText', () => {
  it("writes pip's hash-checking format", () => {
    expect(lockFileText([{ name: 'a', version: '1.0', sha256: H1 }, { name: 'b', version: '2', sha256: null }])).toBe(`a==1.0 --hash=sha256:${H1}\nb==2\n`);
    expect(lockFileText([])).toBe('');
  });
});

describe('environmentDigest', () => {
  const base = { implementation: 'cpython', version: '3.11.2', machine: 'x86_64', platform: 'linux' };
  const parts = { pythonVersion: '3.11', base, runnerSha256: H1, lock: [{ name: 'a', version: '1.0', sha256: H2 }] };
  const d = environmentDigest(parts);

  it('is a sha256 and the same for the same inputs (key order does not matter)', () => {
    expect(d).toMatch(/^[0-9a-f]{64}$/);
    expect(environmentDigest({ ...parts, base: { platform: 'linux', machine: 'x86_64', version: '3.11.2', implementation: 'cpython' } })).toBe(d);
  });

  it.each([
    ['python version', { pythonVersion: '3.12' }],
    ['interpreter build', { base: { ...base, version: '3.11.9' } }],
    ['machine', { base: { ...base, machine: 'aarch64' } }],
    ['runner', { runnerSha256: H2 }],
    ['a requirement version', { lock: [{ name: 'a', version: '1.1', sha256: H2 }] }],
    ['a wheel hash', { lock: [{ name: 'a', version: '1.0', sha256: H1 }] }],
    ['an added requirement', { lock: [...parts.lock, { name: 'b', version: '1', sha256: H1 }] }],
    ['no requirements', { lock: [] }],
  ])('changes with the %s', (_what, change) => {
    expect(environmentDigest({ ...parts, ...change })).not.toBe(d);
  });
});

describe('builtEnvironmentStep: what a run with requirements does about builds', () => {
  const root = mkdtempSync(path.join(tmpdir(), 'sandpod-build-unit-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));
  const config = parseConfig({ workspace: root }, {});
  const clock = { now: () => 1_000 };
  // Not started: any attempt to install would throw, so a decision that needs no install is visible.
  const builder = new LocalBuilder(path.join(root, 'builds'), config, () => null, clock);
  const plain = fromConfig(v.parse(JobTypeConfigSchema, { name: 'bt', requirements: ['sandpod-bt==1.0.0'] }));
  const digest = 'e'.repeat(64);
  const built: JobType = {
    ...plain,
    version: '1.0.0',
    digest,
    build: { id: 'b', digest, imageRef: 'local:x', pythonVersion: '3.11', lock: [], version: '1.0.0', builtAt: new Date(0) },
  };
  mkdirSync(path.join(root, 'builds', 'envs', digest, 'site'), { recursive: true });
  writeFileSync(path.join(root, 'builds', 'envs', digest, 'build.json'), '{}');
  const deadline = 60_000;

  it.each([
    ['built type, its own requirements → the pinned environment, nothing installed', false, built, ['sandpod-bt==1.0.0'], { handled: true, depsDir: path.join(root, 'builds', 'envs', digest, 'site'), installMs: 0 }],
    ['same set in another order and spacing → still the build', false, built, [' sandpod-bt==1.0.0', 'sandpod-bt==1.0.0'], { handled: true, installMs: 0 }],
    ['built type, extra requirements → install as before', false, built, ['sandpod-bt==1.0.0', 'other'], { handled: false }],
    ['unbuilt type → install as before', false, plain, ['sandpod-bt==1.0.0'], { handled: false }],
    ['production: built type → the build', true, built, ['sandpod-bt==1.0.0'], { handled: true, installMs: 0 }],
    ['production: unbuilt type → config_error naming the build call', true, plain, ['sandpod-bt==1.0.0'], { handled: true, end: { infraError: { type: 'config_error', message: expect.stringContaining('POST /job-types/bt/build') } } }],
    ['production: extra requirements → config_error', true, built, ['sandpod-bt==1.0.0', 'other'], { handled: true, end: { infraError: { type: 'config_error' } } }],
  ] as const)('%s', async (_what, production, jobType, requirements, want) => {
    const r = await builtEnvironmentStep(builder, { production_mode: production }, { jobType, requirements: [...requirements] }, clock, deadline);
    expect(r).toMatchObject(want);
  });

  it('a pinned build missing here is reproduced from its lock; failing that, the run ends with a dependency error', async () => {
    const gone = { ...built, build: { ...built.build!, digest: 'f'.repeat(64) } };
    const r = await builtEnvironmentStep(builder, { production_mode: false }, { jobType: gone, requirements: ['sandpod-bt==1.0.0'] }, clock, deadline);
    expect(r).toMatchObject({ handled: true, depsDir: null, end: { dependencyError: expect.stringContaining('not started') } });
  });
});
