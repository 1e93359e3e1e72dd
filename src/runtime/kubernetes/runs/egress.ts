/**
 * The egress proxy's per-run credentials (issue 13): the signing key, read once from
 * `kubernetes.egress_proxy.key_file`, and the proxy's address, resolved here so a proxied pod needs no
 * DNS (its NetworkPolicy does not allow it: DNS queries would be a channel out). A cold run's Job
 * carries the signed proxy URL in its command (build-job.ts); a claimed pool pod gets it on its go line.
 */
import { lookup } from 'node:dns/promises';
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import type { Clock } from '../../../clock.ts';
import type { Config } from '../../../config.ts';
import type { Logger } from '../../../logger.ts';
import type { RunSpec } from '../../runtime.ts';

/** How long a resolved egress proxy address is used before it is looked up again, ms. */
const PROXY_ADDRESS_TTL_MS = 30_000;

/** See the module comment. */
export class EgressCredentials {
  private keyText: string | null = null;
  private proxyAddress: { host: string; address: string; at: number } | null = null;

  constructor(
    private readonly config: Config,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  /** Whether runs of this JobType go through the egress proxy (`allowed_hosts` with a proxy configured). */
  proxied(jobType: RunSpec['jobType']): boolean {
    return !!this.config.kubernetes.egress_proxy && jobType.network.mode === 'bridge' && jobType.network.allowedHosts.length > 0;
  }

  /** The egress proxy's signing key when this run goes through it (read once from `key_file`), else null. */
  key(spec: Pick<RunSpec, 'jobType'>): string | null {
    const proxy = this.config.kubernetes.egress_proxy;
    if (!proxy || !this.proxied(spec.jobType)) return null;
    if (this.keyText === null) {
      try {
        this.keyText = readFileSync(proxy.key_file, 'utf8').trim();
      } catch (err) {
        throw new Error(`kubernetes.egress_proxy.key_file: cannot read ${proxy.key_file}: ${(err as Error).message}`);
      }
    }
    return this.keyText;
  }

  /**
   * The egress proxy's host as an address (cached {@link PROXY_ADDRESS_TTL_MS}). Null when it cannot be
   * resolved: the pod gets the name.
   */
  async address(): Promise<string | null> {
    const proxy = this.config.kubernetes.egress_proxy;
    if (!proxy) return null;
    const host = new URL(proxy.url).hostname.replace(/^\[|\]$/g, '');
    if (isIP(host)) return host;
    const now = this.clock.now();
    if (this.proxyAddress && this.proxyAddress.host === host && now - this.proxyAddress.at < PROXY_ADDRESS_TTL_MS) return this.proxyAddress.address;
    try {
      const { address } = await lookup(host);
      this.proxyAddress = { host, address, at: now };
      return address;
    } catch (err) {
      this.log.warn({ host, err: String(err) }, 'cannot resolve the egress proxy; proxied pods get its name and need DNS to reach it');
      return this.proxyAddress?.host === host ? this.proxyAddress.address : null;
    }
  }

  /** What build-job.ts's `egressProxy` option takes for this run (null: not proxied). */
  async forJob(spec: Pick<RunSpec, 'jobType'>): Promise<{ key: string; nowMs: number; address: string | null } | null> {
    const key = this.key(spec);
    return key === null ? null : { key, nowMs: this.clock.now(), address: await this.address() };
  }
}
