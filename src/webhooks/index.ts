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
 * The delivery worker of this configuration, or null when callbacks are off and no secret is set
 * (`webhooks.allowed_hosts` empty: every callback_url is refused at submission). Throws a
 * ConfigError for callbacks without a signing secret, or a default callback the rules refuse.
 */
export function createWebhooks(config: Pick<Config, 'webhooks'>, deps: Omit<WebhookDeliveryOptions, 'config' | 'signer'>): WebhookDelivery | null {
  const c = config.webhooks;
  if (c.default_callback_url !== null) {
    const r = parseCallbackUrl(c.default_callback_url, c);
    if ('problem' in r) throw new ConfigError(`invalid configuration: webhooks.default_callback_url: ${r.problem}`);
  }
  const secrets = configuredSecrets(c);
  // With secrets but no allowed hosts (callbacks turned off later) the worker still runs: deliveries
  // left pending are refused by the send-time check and end in the DLQ instead of waiting forever.
  if (c.allowed_hosts.length === 0 && secrets.length === 0) return null;
  const signer = new Signer(secrets);
  return new WebhookDelivery({ ...deps, config: c, signer });
}
