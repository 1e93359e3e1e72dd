/**
 * The job-type field `preload` (modules a warm runner imports before its program): the config file,
 * the JobType resource and the digest.
 */
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../../src/config.ts';
import { FileJobTypeRegistry, type JobType } from '../../../src/jobtypes/job-type.ts';
import { jobTypeFromResource } from '../../../src/jobtypes/kubernetes-registry.ts';

const fileType = (jt: Record<string, unknown>) => new FileJobTypeRegistry(parseConfig({ job_types: [{ name: 'x', ...jt }] })).get('x')!;

describe('preload', () => {
  it('the shipped data type preloads numpy and pandas; default and http preload nothing', () => {
    const reg = new FileJobTypeRegistry(parseConfig({}));
    expect(reg.get('data')!.preload).toEqual(['numpy', 'pandas']);
    expect(reg.get('default')!.preload).toEqual([]);
    expect(reg.get('http')!.preload).toEqual([]);
  });

  it('takes dotted module names from the config file and refuses anything else, naming the field', () => {
    expect(fileType({ preload: ['numpy', 'xml.etree.ElementTree', '_private'] }).preload).toEqual(['numpy', 'xml.etree.ElementTree', '_private']);
    for (const bad of ['os; import sys', '1abc', 'a..b', '', 'numpy ', '../x']) {
      expect(() => fileType({ preload: [bad] }), bad).toThrow(ConfigError);
      expect(() => fileType({ preload: [bad] }), bad).toThrow(/preload/);
    }
  });

  it('enters the digest only when set: an empty list keeps the job_ref a type had before the field', () => {
    const without = fileType({});
    expect(fileType({ preload: [] }).digest).toBe(without.digest);
    expect(fileType({ preload: ['json'] }).digest).not.toBe(without.digest);
  });

  it('is read from a JobType resource (spec.preload), and a bad name refuses the resource', () => {
    const jt = jobTypeFromResource({ metadata: { name: 'd' }, spec: { preload: ['numpy', 'pandas'] } }) as JobType;
    expect(jt.preload).toEqual(['numpy', 'pandas']);
    expect((jobTypeFromResource({ metadata: { name: 'd' }, spec: {} }) as JobType).preload).toEqual([]);
    const bad = jobTypeFromResource({ metadata: { name: 'd' }, spec: { preload: ['import os'] } });
    expect(bad).toHaveProperty('error', expect.stringMatching(/preload/));
  });
});
