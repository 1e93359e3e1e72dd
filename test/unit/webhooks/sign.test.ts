import { randomBytes, createHmac } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Webhook } from 'standardwebhooks';
import { describe, expect, it } from 'vitest';
import { verify } from '../../../docs/examples/webhook-receiver.ts';
import { ConfigError } from '../../../src/config.ts';
import { configuredSecrets, Signer } from '../../../src/webhooks/sign.ts';

const secret = () => `whsec_${randomBytes(32).toString('base64')}`;

describe('Signer (Standard Webhooks)', () => {
  it('signs HMAC-SHA256 over id.timestamp.body with the base64-decoded secret', () => {
    const s = secret();
    const at = new Date();
    const body = '{"type":"execution.finished","data":{"status":"succeeded"}}';
    const h = new Signer([s]).headers('msg_1', at, body);
    const ts = String(Math.floor(at.getTime() / 1000));
    const key = Buffer.from(s.slice('whsec_'.length), 'base64');
    const expected = createHmac('sha256', key).update(`msg_1.${ts}.${body}`).digest('base64');
    expect(h).toEqual({ 'webhook-id': 'msg_1', 'webhook-timestamp': ts, 'webhook-signature': `v1,${expected}` });
    // The reference library and the receiver example accept it.
    expect(new Webhook(s).verify(body, h)).toMatchObject({ type: 'execution.finished' });
    expect(verify([s], body, h)).toMatchObject({ data: { status: 'succeeded' } });
  });

  it('rotation: two secrets give two signatures, and a receiver holding either one accepts', () => {
    const [old, next] = [secret(), secret()];
    const body = '{"a":1}';
    const h = new Signer([next, old]).headers('msg_2', new Date(), body);
    expect(h['webhook-signature'].split(' ')).toHaveLength(2);
    expect(verify([old], body, h)).toEqual({ a: 1 });
    expect(verify([next], body, h)).toEqual({ a: 1 });
    expect(() => verify([secret()], body, h)).toThrow(/No matching signature/);
  });

  it('a changed body, id or an old timestamp fails verification', () => {
    const s = secret();
    const h = new Signer([s]).headers('msg_3', new Date(), '{"a":1}');
    expect(() => verify([s], '{"a":2}', h)).toThrow();
    expect(() => verify([s], '{"a":1}', { ...h, 'webhook-id': 'msg_4' })).toThrow();
    const old = new Signer([s]).headers('msg_3', new Date(Date.now() - 10 * 60_000), '{"a":1}');
    expect(() => verify([s], '{"a":1}', old)).toThrow(/too old/);
  });

  it('refuses to sign without a secret', () => {
    expect(() => new Signer([])).toThrow(ConfigError);
  });

  it('reads more secrets from secrets_file (a mounted Kubernetes Secret), and refuses a malformed line', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'whsec-'));
    const [a, b] = [secret(), secret()];
    const file = path.join(dir, 'secrets');
    writeFileSync(file, `# current first\n${b}\n\n${a}\n`);
    expect(configuredSecrets({ secrets: [a], secrets_file: file })).toEqual([a, b]);
    writeFileSync(file, 'not-a-secret\n');
    expect(() => configuredSecrets({ secrets: [], secrets_file: file })).toThrow('line 1');
    expect(() => configuredSecrets({ secrets: [], secrets_file: path.join(dir, 'missing') })).toThrow('cannot read');
  });
});
