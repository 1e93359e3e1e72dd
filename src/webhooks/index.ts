/**
 * Completion webhooks (issue 21), wired from the configuration: the signing secrets, the default
 * callback's check, and the delivery worker. `main.ts` calls {@link createWebhooks} once.
 */
import { ConfigError, type Config } from '../config.ts';
import { WebhookDelivery, type WebhookDeliveryOptions } from './deliver.ts';
import { configuredSecrets, Signer } from './sign.ts';
import { parseCallbackUrl } from './ssrf.ts';

export { WebhookDelivery, payloadOf, type DeliveryOutcome } from './deliver.ts';
export { Signer } from './sign.ts';

/**
 * The delivery worker of this configuration, or null when callbacks are off (`webhooks.allowed_hosts`
 * empty: every callback_url is refused at submission, so nothing can reach the outbox). Throws a
 * ConfigError for callbacks without a signing secret, or a default callback the rules refuse.
 */
export function createWebhooks(config: Pick<Config, 'webhooks'>, deps: Omit<WebhookDeliveryOptions, 'config' | 'signer'>): WebhookDelivery | null {
  const c = config.webhooks;
  if (c.default_callback_url !== null) {
    const r = parseCallbackUrl(c.default_callback_url, c);
    if ('problem' in r) throw new ConfigError(`invalid configuration: webhooks.default_callback_url: ${r.problem}`);
  }
  if (c.allowed_hosts.length === 0) return null;
  const signer = new Signer(configuredSecrets(c));
  return new WebhookDelivery({ ...deps, config: c, signer });
}
