/** version_tag validation (semver 2.0.0) and the build view. */
import { describe, expect, it } from 'vitest';
import { AppError } from '../../../src/errors.ts';
import { buildView, checkVersionTag, publicImageRef, SEMVER_RE } from '../../../src/jobtypes/builds.ts';

describe('version_tag', () => {
  it.each(['0.0.0', '1.2.3', '10.20.30', '1.0.0-rc.1', '1.0.0-alpha.beta', '1.0.0+build.5', '1.0.0-0.3.7+exp.sha.5114f85', '2.0.0-x-y-z.--'])('accepts %s', (t) => {
    expect(SEMVER_RE.test(t)).toBe(true);
    expect(() => checkVersionTag(t)).not.toThrow();
  });

  it.each(['', 'latest', 'v1.2.3', '1.2', '1', '01.2.3', '1.02.3', '1.2.3-', '1.2.3-01', '1.2.3+', '1.2.3 ', ' 1.2.3', '1.2.3\n', '1.2.3.4', '1.2.3-α'])('refuses %j with a 400 naming the field', (t) => {
    expect(SEMVER_RE.test(t)).toBe(false);
    let err: unknown;
    try {
      checkVersionTag(t);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).status).toBe(400);
    expect((err as AppError).message).toContain('version_tag');
  });

  it('null (no tag) is fine', () => expect(() => checkVersionTag(null)).not.toThrow());
});

describe('buildView', () => {
  const row = {
    id: 'b1',
    job_type: 'data',
    input_key: 'k',
    status: 'built',
    version_tag: null,
    requirements: ['numpy'],
    python_version: '3.11',
    phase: 'built',
    digest: 'c'.repeat(64),
    image_ref: `local:sha256:${'c'.repeat(64)}`,
    lock: [{ name: 'numpy', version: '2.0.0', sha256: 'd'.repeat(64) }],
    error: null,
    owner: 'o',
    heartbeat_at: new Date(0),
    created_at: new Date('2026-01-01T00:00:00Z'),
    finished_at: new Date('2026-01-01T00:00:05Z'),
    duration_ms: 5000,
  };

  it('names the version <job_type>@sha256:<digest> and keeps the lock as resolved_requirements', () => {
    expect(buildView(row)).toEqual({
      id: 'b1',
      status: 'built',
      job_type: 'data',
      version: `data@sha256:${'c'.repeat(64)}`,
      digest: 'c'.repeat(64),
      image_ref: `local:sha256:${'c'.repeat(64)}`,
      version_tag: null,
      phase: 'built',
      python_version: '3.11',
      requirements: ['numpy'],
      resolved_requirements: row.lock,
      duration_ms: 5000,
      error: null,
      created_at: '2026-01-01T00:00:00.000Z',
      finished_at: '2026-01-01T00:00:05.000Z',
    });
  });

  it('a row stored with a host path (before issue 22) is shown without it', () => {
    const legacy = { ...row, image_ref: `local:/var/lib/sandpod/sandbox/i-1/builds/envs/${'c'.repeat(64)}` };
    expect(buildView(legacy).image_ref).toBe(`local:sha256:${'c'.repeat(64)}`);
    expect(publicImageRef(legacy.image_ref)).toBe(`local:sha256:${'c'.repeat(64)}`);
    // Images (the cluster's builds, configured images) are shown as they are.
    const image = `registry.example.com/sandpod/builds/data@sha256:${'e'.repeat(64)}`;
    expect(publicImageRef(image)).toBe(image);
    expect(publicImageRef(null)).toBeNull();
  });

  it('a build still running has no version yet', () => {
    expect(buildView({ ...row, status: 'building', phase: 'installing', digest: null, image_ref: null, lock: null, finished_at: null, duration_ms: null })).toMatchObject({
      status: 'building',
      version: null,
      resolved_requirements: null,
      finished_at: null,
    });
  });
});
