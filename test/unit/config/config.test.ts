import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig, parseConfig, parseMemory } from '../../../src/config.ts';
import { FileJobTypeRegistry, jobRef } from '../../../src/jobtypes/job-type.ts';

describe('config', () => {
  it('defaults match SPEC §8', () => {
    const c = parseConfig({}, {});
    expect(c).toMatchObject({
      production_mode: false,
      max_workers: 4,
      max_queue_size: 100,
      default_timeout: 30,
      max_timeout: 120,
      max_stdout_bytes: 32768,
      max_artifact_bytes: 5242880,
      enable_seccomp: true,
      security_mode: 'permissive',
      port: 8000,
      runtime: 'local',
      sandbox_engine: 'auto',
    });
    expect(Object.isFrozen(c)).toBe(true);
  });

  it('env wins over the file', () => {
    const c = parseConfig({ port: 1234, workspace: '/a' }, { PORT: '9000', SVC_WORKSPACE: '/b', SVC_DATABASE_URL: 'postgres://x/y' });
    expect(c.port).toBe(9000);
    expect(c.workspace).toBe('/b');
    expect(c.database_url).toBe('postgres://x/y');
  });

  it('reads YAML and JSON files named by SVC_CONFIG', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'cfg-'));
    writeFileSync(path.join(dir, 'c.yaml'), 'max_workers: 8\nsecurity_mode: strict\njob_types:\n  - name: ml\n    memory_limit: 2g\n');
    writeFileSync(path.join(dir, 'c.json'), '{"max_queue_size": 500}');
    expect(loadConfig({ SVC_CONFIG: path.join(dir, 'c.yaml') })).toMatchObject({ max_workers: 8, security_mode: 'strict' });
    expect(loadConfig({ SVC_CONFIG: path.join(dir, 'c.json') }).max_queue_size).toBe(500);
  });

  it.each([
    [{ max_workers: 'four' }, 'max_workers'],
    [{ security_mode: 'paranoid' }, 'security_mode'],
    [{ sandbox_engine: 'docker' }, 'sandbox_engine'],
    [{ job_types: [{ name: 'Bad Name' }] }, 'job_types.0.name'],
    [{ job_types: [{ name: 'x', memory_limit: 'lots' }] }, 'job_types.0.memory_limit'],
    [{ no_such_key: 1 }, 'no_such_key'],
    [{ default_timeout: 500, max_timeout: 100 }, 'default_timeout'],
  ])('rejects %j naming %s', (raw, key) => {
    expect(() => parseConfig(raw, {})).toThrow(ConfigError);
    expect(() => parseConfig(raw, {})).toThrow(key);
  });

  it('rejects a bad PORT', () => {
    expect(() => parseConfig({}, { PORT: 'http' })).toThrow('PORT');
  });

  it('parses memory sizes', () => {
    expect(parseMemory('512m')).toBe(512 * 1024 ** 2);
    expect(parseMemory('1g')).toBe(1024 ** 3);
    expect(parseMemory('1Gi')).toBe(1024 ** 3);
    expect(parseMemory('100k')).toBe(102400);
    expect(parseMemory('4096')).toBe(4096);
  });

  it('has the three built-in job types; config overrides by name; digests change with the spec', () => {
    const base = new FileJobTypeRegistry(parseConfig({}, {}));
    expect(base.list().map((j) => j.name)).toEqual(['data', 'default', 'http']);
    expect(base.get('default')).toMatchObject({ network: { mode: 'none' }, requirements: [] });
    expect(base.get('http')?.network.mode).toBe('bridge');
    const over = new FileJobTypeRegistry(parseConfig({ job_types: [{ name: 'default', memory_limit: '256m' }] }, {}));
    expect(over.get('default')?.memoryLimit).toBe('256m');
    expect(jobRef(over.get('default')!)).toMatch(/^default@sha256:[0-9a-f]{64}$/);
    expect(jobRef(over.get('default')!)).not.toBe(jobRef(base.get('default')!));
  });

  it('takes allowed_hosts patterns and refuses anything else, naming the entry', () => {
    const hosts = ['api.github.com', '*.example.com', '*', '203.0.113.7', '2001:db8::1', 'pypi.org:443', '[2001:db8::1]:8443'];
    const c = parseConfig({ job_types: [{ name: 'web', network: { mode: 'bridge', allowed_hosts: hosts } }] }, {});
    expect(new FileJobTypeRegistry(c).get('web')?.network.allowedHosts).toEqual(hosts);
    for (const bad of ['http://x.com', 'a b', '*x.com', 'x.*', '', 'x..com', 'x.com:0', 'x.com:99999', '[x.com]:80']) {
      expect(() => parseConfig({ job_types: [{ name: 'web', network: { mode: 'bridge', allowed_hosts: [bad] } }] }, {}), bad).toThrow(
        /job_types\.0\.network\.allowed_hosts\.0: must be a host pattern/,
      );
    }
  });
});

describe('config with the kubernetes runtime', () => {
  it('defaults max_input_bytes to 512 KiB and refuses payloads that cannot fit a Secret', () => {
    expect(parseConfig({ runtime: 'kubernetes' }, {}).max_input_bytes).toBe(512 * 1024);
    expect(parseConfig({ runtime: 'kubernetes', max_input_bytes: 700 * 1024 }, {}).max_input_bytes).toBe(700 * 1024);
    expect(() => parseConfig({ runtime: 'kubernetes', max_input_bytes: 1024 * 1024 }, {})).toThrow('Secret');
    expect(parseConfig({ runtime: 'local' }, {}).max_input_bytes).toBe(1024 * 1024);
  });
});
