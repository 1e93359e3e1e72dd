import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../../src/config.ts';
import { AppError } from '../../../src/errors.ts';
import { callbackUrlOf } from '../../../src/executions/requests.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import { silentLogger } from '../../../src/logger.ts';
import type { Db } from '../../../src/store/database.ts';
import { createWebhooks, WebhookDelivery } from '../../../src/webhooks/index.ts';

const secret = `whsec_${randomBytes(32).toString('base64')}`;
const deps = { db: {} as Db, logger: silentLogger };
const cfg = (webhooks: Record<string, unknown>, extra: Record<string, unknown> = {}) => parseConfig({ webhooks, ...extra }, {});

describe('createWebhooks', () => {
  it('is off without allowed_hosts, on with them and a secret', () => {
    expect(createWebhooks(cfg({}), deps)).toBeNull();
    expect(createWebhooks(cfg({ allowed_hosts: ['hooks.example.com'], secrets: [secret] }), deps)).toBeInstanceOf(WebhookDelivery);
    // Turned off later with a secret kept: the worker runs, so what was pending is refused and ends.
    expect(createWebhooks(cfg({ secrets: [secret] }), deps)).toBeInstanceOf(WebhookDelivery);
  });

  it('refuses to start callbacks without a signing secret, or with a default callback the rules refuse', () => {
    expect(() => createWebhooks(cfg({ allowed_hosts: ['hooks.example.com'] }), deps)).toThrow(ConfigError);
    expect(() => createWebhooks(cfg({ allowed_hosts: ['hooks.example.com'] }), deps)).toThrow('no signing secret is configured');
    expect(() => createWebhooks(cfg({ allowed_hosts: ['hooks.example.com'], secrets: [secret], default_callback_url: 'http://127.0.0.1/x' }), deps)).toThrow(
      'webhooks.default_callback_url: host 127.0.0.1 does not match webhooks.allowed_hosts',
    );
  });

  it('the config schema refuses a malformed secret and a bad host pattern, naming the key', () => {
    expect(() => cfg({ secrets: ['hunter2'] })).toThrow(/webhooks\.secrets\.0: must be a Standard Webhooks secret/);
    expect(() => cfg({ allowed_hosts: ['http://x'] })).toThrow(/webhooks\.allowed_hosts\.0: must be a host pattern/);
  });
});

describe('callbackUrlOf: the submission, then the job type, then the config default', () => {
  const config = cfg(
    { allowed_hosts: ['*.example.com'], secrets: [secret], default_callback_url: 'https://default.example.com/h' },
    { job_types: [{ name: 'typed', callback_url: 'https://type.example.com/h' }, { name: 'bad', callback_url: 'http://10.0.0.1/h' }] },
  );
  const reg = new FileJobTypeRegistry(config);
  const jt = (n: string) => reg.get(n)!;
  it.each([
    ['own', 'default', 'https://own.example.com/h', 'https://own.example.com/h'],
    ['null opts out', 'typed', null, null],
    ['job type', 'typed', undefined, 'https://type.example.com/h'],
    ['config default', 'default', undefined, 'https://default.example.com/h'],
  ])('%s', (_n, type, asked, want) => {
    expect(callbackUrlOf(config, jt(type), asked as string | null | undefined)).toBe(want);
  });

  it('a default the rules refuse is a 400 naming where it came from', () => {
    expect(() => callbackUrlOf(config, jt('bad'), undefined)).toThrow(AppError);
    expect(() => callbackUrlOf(config, jt('bad'), undefined)).toThrow("callback_url of job type 'bad': host 10.0.0.1 does not match");
    expect(callbackUrlOf(cfg({}), jt('default'), undefined)).toBeNull();
  });
});

describe('a JobType resource names its callback', () => {
  it('spec.callbackUrl becomes the job type default, outside its digest', async () => {
    const { jobTypeFromResource } = await import('../../../src/jobtypes/kubernetes-registry.ts');
    const a = jobTypeFromResource({ metadata: { name: 'x' }, spec: { callbackUrl: 'https://hooks.example.com/x' } });
    const b = jobTypeFromResource({ metadata: { name: 'x' }, spec: {} });
    expect(a).toMatchObject({ callbackUrl: 'https://hooks.example.com/x' });
    expect(b).not.toHaveProperty('callbackUrl');
    expect((a as { digest: string }).digest).toBe((b as { digest: string }).digest);
  });
});
