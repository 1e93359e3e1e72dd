/**
 * The egress proxy of a warm sandbox whose job type lists `allowed_hosts`. It listens from the
 * sandbox's start on the sandbox's own Unix socket (in its run directory, mounted read-only at
 * EGRESS_DIR, relayed inside by the runner's `--egress-proxy`), but lets nothing through until a run
 * is bound to it at the claim ({@link WarmEgress.bind}): what is per run (the run's identity, the
 * hosts it may reach) is never baked in at start. The socket is the sandbox's alone, so a claimed
 * sandbox reaches exactly its run's hosts and nothing another run was allowed.
 */
import path from 'node:path';
import type { Logger } from '../../../logger.ts';
import { EgressProxy } from '../runs/egress-proxy.ts';

/** Longest Unix socket path Linux takes (sun_path is 108 bytes with its NUL). */
const MAX_UNIX_PATH = 107;

interface Binding {
  executionId: string;
  allowedHosts: string[];
}

/** See the module comment. */
export class WarmEgress {
  private bound: Binding | null = null;
  private proxy: EgressProxy | null = null;

  private constructor() {}

  /** The socket path of a sandbox's proxy in its `net/` directory, or why it cannot be used. */
  static socketPath(netDir: string): string | { error: string } {
    const p = path.join(netDir, 'proxy.sock');
    return Buffer.byteLength(p) > MAX_UNIX_PATH ? { error: `the workspace path is too long for the egress proxy socket (${p}); use a shorter workspace` } : p;
  }

  /** Starts listening on `socketPath`; every request is refused until {@link bind}. */
  static async open(socketPath: string, log: Logger): Promise<WarmEgress> {
    const w = new WarmEgress();
    w.proxy = await EgressProxy.listen(socketPath, {
      authenticate: () => w.bound ?? { refused: 'no run is bound to this sandbox yet' },
      onDecision: (d) => {
        if (!d.allowed) log.info({ execution_id: d.executionId ?? null, host: d.host, port: d.port, reason: d.reason }, 'egress refused');
      },
    });
    return w;
  }

  /** The claim: from now on the proxy serves this run, with these hosts. Once only. */
  bind(executionId: string, allowedHosts: string[]): void {
    if (this.bound) throw new Error('a warm sandbox serves one run');
    this.bound = { executionId, allowedHosts: [...allowedHosts] };
  }

  async close(): Promise<void> {
    await this.proxy?.close();
  }
}
