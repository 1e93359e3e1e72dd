/**
 * Claims on the durable queue (the `executions` table): taking the oldest queued job for one process,
 * and giving a held job back. Claims are single statements with `FOR UPDATE SKIP LOCKED`, so several
 * processes share one queue without running a job twice and no transaction outlives a statement.
 */
import { sql } from 'kysely';
import type { Clock } from '../clock.ts';
import type { Db, ExecutionRow } from '../store/database.ts';
import { updateExecutionIf, type Q } from '../store/executions.repository.ts';
import type { QueuedNotifier } from './channels.ts';

/**
 * Claims the oldest queued record for `worker`: `running`, held by `worker`, heartbeat and start time
 * `now`, phase `startup`, one more attempt. Records given back with a `run_after` later than `now`
 * wait. Undefined when nothing is queued (or all is being claimed or waiting).
 */
export async function claimNext(db: Q, worker: string, now: Date): Promise<ExecutionRow | undefined> {
  const res = await sql<ExecutionRow>`
    UPDATE executions SET status = 'running', claimed_by = ${worker}, started_at = ${now}, heartbeat_at = ${now},
           phase = 'startup', attempts = attempts + 1
    WHERE id = (
      SELECT id FROM executions WHERE status = 'queued' AND (run_after IS NULL OR run_after <= ${now})
      ORDER BY created_at, id
      LIMIT 1
      FOR UPDATE SKIP LOCKED
    )
    RETURNING *`.execute(db);
  return res.rows[0];
}

/** When a given-back job may be claimed again, and its count of infrastructure failures. */
export interface GiveBack {
  runAfter?: Date;
  infraFailures?: number;
}

/**
 * Puts a running record held by `worker` back in the queue as if never started (the attempt count
 * stays), optionally not to be claimed before `runAfter`. Undefined when it is not ours any more
 * (settled or adopted elsewhere).
 */
export async function unclaim(db: Q, id: string, worker: string, g: GiveBack = {}): Promise<ExecutionRow | undefined> {
  return updateExecutionIf(
    db,
    id,
    ['running'],
    {
      status: 'queued',
      claimed_by: null,
      started_at: null,
      heartbeat_at: null,
      phase: null,
      run_after: g.runAfter ?? null,
      ...(g.infraFailures !== undefined ? { infra_failures: g.infraFailures } : {}),
    },
    worker,
  );
}

/** One process's claims: what the dispatcher and the running module use. */
export class Claims {
  constructor(
    private readonly o: { db: Db; workerId: string; clock: Clock; notifier: QueuedNotifier },
  ) {}

  /** Claims the oldest queued job for this process, or undefined. */
  claim(): Promise<ExecutionRow | undefined> {
    return claimNext(this.o.db.kysely, this.o.workerId, new Date(this.o.clock.now()));
  }

  /** Returns a held job to the queue and wakes the dispatchers; the current record either way. */
  async giveBack(row: ExecutionRow, g: GiveBack = {}): Promise<ExecutionRow> {
    const u = await unclaim(this.o.db.kysely, row.id, this.o.workerId, g);
    if (u) this.o.notifier.notify();
    return u ?? row;
  }
}
