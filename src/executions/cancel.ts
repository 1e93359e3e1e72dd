/**
 * Cancellation of a job (SPEC §4.5) as a record transition: a queued record is cancelled at once;
 * a running one is handed to its holder (`queue/holders.ts` reaches it in any process) and waited for.
 */
import type { Clock } from '../clock.ts';
import { AppError } from '../errors.ts';
import { DONE_CHANNEL } from '../queue/channels.ts';
import type { Holders } from '../queue/holders.ts';
import type { Db, ExecutionRow } from '../store/database.ts';
import { getExecution, updateExecutionIf } from '../store/executions.repository.ts';
import type { RunError } from './classify.ts';
import type { ExecutionEvents } from './running.ts';
import { isTerminal } from './status.ts';

/** Waits up to `ms` for a record to settle; the record then (terminal or not), or undefined. */
export type SettleWaiter = (id: string, ms: number) => Promise<ExecutionRow | undefined>;

/**
 * Cancels a job. Queued: cancelled at once. Running: the holder (this process or another) kills the
 * sandbox; waits up to `waitMs` with `waitFor` for the record to settle. Already cancelled: returned
 * as is. Otherwise finished: 409. Unknown: 404.
 */
export async function cancelJob(
  o: { db: Db; holders: Holders; clock: Clock; events?: ExecutionEvents | undefined },
  id: string,
  waitMs: number,
  waitFor?: SettleWaiter,
): Promise<ExecutionRow> {
  const row = await getExecution(o.db.kysely, id);
  if (!row) throw new AppError('not_found', `job '${id}' not found`);
  if (row.status === 'cancelled') return row;
  if (isTerminal(row.status)) {
    throw new AppError('conflict', `job '${id}' already finished with status '${row.status}'; nothing to cancel`, { status: row.status });
  }
  const cancelled = await updateExecutionIf(o.db.kysely, id, ['queued'], {
    status: 'cancelled',
    ended_at: new Date(o.clock.now()),
    duration_ms: 0,
    error: JSON.stringify({ type: 'cancelled', message: 'cancelled by user before it started' } satisfies RunError),
    timing: JSON.stringify({ startup_ms: 0, dep_install_ms: 0, execution_ms: 0, total_ms: 0, phase_at_exit: 'startup' }),
  });
  if (cancelled) {
    void o.db.notify(DONE_CHANNEL, id).catch(() => {});
    o.events?.onFinished?.(cancelled);
    return cancelled;
  }
  await o.holders.requestCancel(id);
  const settled = waitFor ? await waitFor(id, waitMs) : undefined;
  return settled ?? (await getExecution(o.db.kysely, id)) ?? row;
}
