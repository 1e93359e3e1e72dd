/**
 * The queue's NOTIFY channels (one database, every process listens) and the coalesced "work queued"
 * wake-up. A notification is only ever a hint: dispatchers claim from the table, waiters re-read the
 * record, and holders also learn of cancellations from their heartbeat, so a lost one costs latency,
 * never correctness.
 */
import type { Db } from '../store/database.ts';

/** An execution reached a terminal status (payload: its id). */
export const DONE_CHANNEL = 'sandpod_done';
/** Work was queued (empty payload: a wake-up; dispatchers claim from the table). */
export const QUEUED_CHANNEL = 'sandpod_queued';
/** Cancellation of a running execution was requested (payload: its id). */
export const CANCEL_CHANNEL = 'sandpod_cancel';

/**
 * Sends "work queued" wake-ups. Coalesced: one NOTIFY in flight plus one pending covers any number of
 * submissions, since a wake-up carries no data.
 */
export class QueuedNotifier {
  private inFlight = false;
  private again = false;

  constructor(private readonly db: Db) {}

  /** Wakes dispatchers in every process (fire and forget; a lost one is covered by their poll). */
  notify(): void {
    if (this.inFlight) {
      this.again = true;
      return;
    }
    this.inFlight = true;
    void this.db
      .notify(QUEUED_CHANNEL, '')
      .catch(() => {})
      .finally(() => {
        this.inFlight = false;
        if (this.again) {
          this.again = false;
          this.notify();
        }
      });
  }
}
