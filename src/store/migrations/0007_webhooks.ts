import { sql, type Kysely } from 'kysely';

/**
 * Completion webhooks (issue 21):
 *
 * - `executions.callback_url`: where the record goes when it ends (null: nowhere).
 * - `webhook_deliveries`: the outbox, one row per record that ended with a callback. A trigger on
 *   `executions` writes it, so it is in the same transaction as the verdict on every path that ends a
 *   record (finalize, cancel, recovery, a session's cell) with nothing for those paths to remember; it
 *   also wakes the delivery workers (`NOTIFY sandpod_webhooks`, sent on commit). The row's id is the
 *   `webhook-id` every attempt carries, so a receiver can drop a duplicate.
 * - `webhook_attempts`: one row per attempt (`GET /jobs/{id}/deliveries`): when, how long, the status
 *   code or the error. The answer's body is never stored.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await db.schema.alterTable('executions').addColumn('callback_url', 'text').execute();
  await db.schema
    .createTable('webhook_deliveries')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('execution_id', 'text', (c) => c.notNull().references('executions.id').onDelete('cascade'))
    .addColumn('url', 'text', (c) => c.notNull())
    // `pending` until `delivered` or `failed`.
    .addColumn('status', 'text', (c) => c.notNull().defaultTo('pending'))
    .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
    // Null: due at once. The workers compare with their own clock, never the database's.
    .addColumn('next_attempt_at', 'timestamptz')
    .addColumn('first_attempt_at', 'timestamptz')
    // A worker sending it holds it until then; past it (the worker died) another one may send it again.
    .addColumn('lease_until', 'timestamptz')
    .addColumn('claimed_by', 'text')
    .addColumn('last_status_code', 'integer')
    .addColumn('last_error', 'text')
    .addColumn('created_at', 'timestamptz', (c) => c.notNull().defaultTo(sql`now()`))
    .addColumn('ended_at', 'timestamptz')
    .execute();
  await db.schema.createIndex('webhook_deliveries_execution').on('webhook_deliveries').column('execution_id').execute();
  await sql`CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending'`.execute(db);
  await db.schema
    .createTable('webhook_attempts')
    .addColumn('id', 'serial', (c) => c.primaryKey())
    .addColumn('delivery_id', 'text', (c) => c.notNull().references('webhook_deliveries.id').onDelete('cascade'))
    .addColumn('attempt', 'integer', (c) => c.notNull())
    .addColumn('started_at', 'timestamptz', (c) => c.notNull())
    .addColumn('duration_ms', 'integer', (c) => c.notNull())
    .addColumn('status_code', 'integer')
    .addColumn('error', 'text')
    // `delivered`, `retried` (another attempt follows) or `failed` (the last one).
    .addColumn('outcome', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('webhook_attempts_delivery').on('webhook_attempts').columns(['delivery_id', 'attempt']).execute();
  await sql`
    CREATE FUNCTION sandpod_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' OR OLD.status NOT IN ('succeeded', 'failed', 'timeout', 'oom', 'cancelled') THEN
        INSERT INTO webhook_deliveries (id, execution_id, url) VALUES ('msg_' || NEW.id, NEW.id, NEW.callback_url)
          ON CONFLICT (id) DO NOTHING;
        PERFORM pg_notify('sandpod_webhooks', NEW.id);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER sandpod_webhook_outbox AFTER INSERT OR UPDATE OF status ON executions
    FOR EACH ROW WHEN (NEW.callback_url IS NOT NULL AND NEW.status IN ('succeeded', 'failed', 'timeout', 'oom', 'cancelled'))
    EXECUTE FUNCTION sandpod_webhook_outbox()`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`DROP TRIGGER IF EXISTS sandpod_webhook_outbox ON executions`.execute(db);
  await sql`DROP FUNCTION IF EXISTS sandpod_webhook_outbox()`.execute(db);
  await db.schema.dropTable('webhook_attempts').ifExists().execute();
  await db.schema.dropTable('webhook_deliveries').ifExists().execute();
  await db.schema.alterTable('executions').dropColumn('callback_url').execute();
}
