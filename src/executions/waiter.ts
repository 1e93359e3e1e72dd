/**
 * Long-poll support: one LISTEN on the "done" channel per process fans out to waiters by id, so
 * `GET /jobs/{id}/result?wait=true` wakes the moment the job finishes — in this process or another.
 */
import { DONE_CHANNEL } from '../queue/channels.ts';
import type { Db, ExecutionRow } from '../store/database.ts';
import { getExecution } from '../store/executions.repository.ts';
import { isTerminal } from './status.ts';

/** Waits for executions to reach a terminal status. */
export class CompletionWaiter {
  private readonly waiters = new Map<string, Set<() => void>>();
  private unlisten: (() => Promise<void>) | null = null;

  constructor(private readonly db: Db) {}

  async start(): Promise<void> {
    this.unlisten = await this.db.listen(DONE_CHANNEL, (id) => {
      for (const w of this.waiters.get(id) ?? []) w();
    });
  }

  async stop(): Promise<void> {
    await this.unlisten?.();
    this.unlisten = null;
  }

  /**
   * Resolves with the terminal record, or with the current (non-terminal) one when `timeoutMs` runs
   * out or `signal` aborts; undefined when there is no such record.
   */
  async wait(id: string, timeoutMs: number, signal?: AbortSignal): Promise<ExecutionRow | undefined> {
    let wake!: () => void;
    const woken = new Promise<void>((r) => (wake = r));
    let set = this.waiters.get(id);
    if (!set) this.waiters.set(id, (set = new Set()));
    set.add(wake);
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => wake();
    try {
      // Subscribed first, read second: a completion between the two cannot be missed.
      const first = await getExecution(this.db.kysely, id);
      if (!first || isTerminal(first.status)) return first;
      timer = setTimeout(wake, timeoutMs);
      signal?.addEventListener('abort', onAbort, { once: true });
      await woken;
      return await getExecution(this.db.kysely, id);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      set.delete(wake);
      if (set.size === 0) this.waiters.delete(id);
    }
  }
}
