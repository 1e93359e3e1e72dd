/**
 * The RuntimeClass runs get, from a cached lookup: always the configured one in `strict` (false when
 * it is known not to exist), in `permissive` only when it exists. A stale answer beats none; an
 * unknown one (API error, nothing cached) is never taken as "absent".
 */
import type { Clock } from '../../clock.ts';
import type { Config } from '../../config.ts';
import type { KubeApi } from '../../kube/index.ts';
import type { Logger } from '../../logger.ts';

/** See the module comment. */
export class RuntimeClassLookup {
  private cached: { exists: boolean | null; at: number } = { exists: null, at: 0 };

  constructor(
    private readonly o: { api: KubeApi; config: Config; clock: Clock; log: Logger; cacheMs?: number },
  ) {}

  /** The last answer (null: unknown). */
  get exists(): boolean | null {
    return this.cached.exists;
  }

  /** The RuntimeClass to put on a run (null: none; false: none may run). Throws when unknown. */
  async forRun(): Promise<string | null | false> {
    const name = this.o.config.kubernetes.runtime_class;
    const exists = await this.refresh();
    // Unknown is not "absent": in strict mode that would fail the run as a config error on an API blip.
    if (exists === null) throw new Error(`cannot read RuntimeClass ${name}; retry`);
    if (this.o.config.security_mode === 'strict') return exists === false ? false : name;
    return exists ? name : null;
  }

  /** Whether the RuntimeClass exists, cached; null when unknown (API error). */
  async refresh(force = false): Promise<boolean | null> {
    const ttl = this.o.cacheMs ?? 60_000;
    const now = this.o.clock.now();
    if (!force && this.cached.exists !== null && now - this.cached.at < Math.max(ttl, 30_000)) return this.cached.exists;
    try {
      const exists = await this.o.api.runtimeClassExists(this.o.config.kubernetes.runtime_class);
      this.cached = { exists, at: now };
      return exists;
    } catch (err) {
      this.o.log.warn({ err: String(err) }, 'cannot read RuntimeClass');
      return this.cached.exists;
    }
  }
}
