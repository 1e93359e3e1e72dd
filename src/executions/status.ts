/**
 * Statuses of SPEC §3, in one place: the record's status union, which of them are terminal, and the
 * queue-facing names (the queue says `pending` where the record says `queued`).
 *
 * A leaf module (no imports), so the store may use the same vocabulary in its SQL without depending
 * on the lifecycle code above it.
 */

/** Record statuses (SPEC §3). */
export const RECORD_STATUSES = ['queued', 'running', 'succeeded', 'failed', 'timeout', 'oom', 'cancelled'] as const;
export type RecordStatus = (typeof RECORD_STATUSES)[number];

/** Terminal record statuses (SPEC §3). */
export const TERMINAL_STATUSES = ['succeeded', 'failed', 'timeout', 'oom', 'cancelled'] as const;
export type TerminalStatus = (typeof TERMINAL_STATUSES)[number];

/** True for a terminal record status. */
export function isTerminal(status: string): status is TerminalStatus {
  return (TERMINAL_STATUSES as readonly string[]).includes(status);
}

/** Statuses as the queue names them in submission and not-ready answers. */
export type QueueStatus = 'pending' | Exclude<RecordStatus, 'queued'>;

/** The queue's name for a record status (SPEC §3: `queued` is `pending` to the queue). */
export function queueStatus(status: RecordStatus | string): QueueStatus {
  return (status === 'queued' ? 'pending' : status) as QueueStatus;
}

/** What a history filter accepts: the record statuses plus the queue's `pending` alias of `queued`. */
export const STATUS_FILTERS = [...RECORD_STATUSES, 'pending'] as const;

/** The record status a history filter means (`pending` means `queued`). */
export function recordStatusOf(filter: (typeof STATUS_FILTERS)[number]): RecordStatus {
  return filter === 'pending' ? 'queued' : filter;
}
