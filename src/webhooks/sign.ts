/**
 * Standard Webhooks signing (https://www.standardwebhooks.com), through the `standardwebhooks`
 * package: `webhook-id`, `webhook-timestamp` (seconds) and `webhook-signature`, an HMAC-SHA256 over
 * `id.timestamp.body` per secret, `v1,<base64>`, space-separated. With two secrets (a rotation) every
 * delivery carries both signatures, so a receiver holding either one accepts it.
 */
import { readFileSync } from 'node:fs';
import { Webhook } from 'standardwebhooks';
import { ConfigError } from '../config.ts';
import { SECRET_RE, type WebhooksConfig } from './config.ts';

/** Signs deliveries with every configured secret. */
export class Signer {
  private readonly hooks: Webhook[];

  /** Throws when `secrets` is empty: an unsigned callback would let anyone forge a result. */
  constructor(readonly secrets: readonly string[]) {
    if (secrets.length === 0) throw new ConfigError('webhooks: callbacks are allowed (webhooks.allowed_hosts) but no signing secret is configured (webhooks.secrets or webhooks.secrets_file)');
    this.hooks = secrets.map((s) => new Webhook(s));
  }

  /** The three headers of one attempt; `at` is the attempt's time (a retry is signed anew). */
  headers(id: string, at: Date, body: string): { 'webhook-id': string; 'webhook-timestamp': string; 'webhook-signature': string } {
    return {
      'webhook-id': id,
      'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
      'webhook-signature': this.hooks.map((h) => h.sign(id, at, body)).join(' '),
    };
  }
}

/**
 * The secrets of the configuration: `webhooks.secrets`, then those in `webhooks.secrets_file` (one per
 * line; blank lines and `#` comments skipped). A file that cannot be read or holds a malformed secret
 * stops the start.
 */
export function configuredSecrets(c: Pick<WebhooksConfig, 'secrets' | 'secrets_file'>): string[] {
  const out = [...c.secrets];
  if (c.secrets_file) {
    let text: string;
    try {
      text = readFileSync(c.secrets_file, 'utf8');
    } catch (err) {
      throw new ConfigError(`webhooks.secrets_file: cannot read ${c.secrets_file}: ${(err as Error).message}`);
    }
    for (const [i, raw] of text.split('\n').entries()) {
      const line = raw.trim();
      if (line === '' || line.startsWith('#')) continue;
      if (!SECRET_RE.test(line)) throw new ConfigError(`webhooks.secrets_file: line ${i + 1} of ${c.secrets_file} is not a Standard Webhooks secret (whsec_ followed by base64)`);
      out.push(line);
    }
  }
  return [...new Set(out)];
}
