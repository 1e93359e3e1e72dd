/**
 * A session's owner is judged by its holder lease (queue/leases.ts) before its heartbeat: an owner
 * whose lease is live keeps its sessions however old the heartbeat it wrote with its own clock looks
 * (a slow replica); once the lease has expired its sessions end `service_restart`.
 */
import { sql } from 'kysely';
import { afterAll, describe, expect, it } from 'vitest';
import { startTestService, type TestService } from '../../support/service.ts';

let svc: TestService | undefined;
afterAll(async () => {
  await svc?.close();
});

describe('sessions of another process', () => {
  it('are not ended while its lease is live; are ended once it has expired', async () => {
    svc = await startTestService();
    expect(svc.sessions).toBeDefined();
    const sessions = svc.sessions!;
    const db = svc.db.kysely;
    const owner = 'replica-s/1/s';
    const old = new Date(Date.now() - 3_600_000);
    await db
      .insertInto('sessions')
      .values({ id: 'sess-slow-owner', status: 'ready', end_reason: null, job_type: 'default', idle_timeout_s: 86_400, max_lifetime_s: 86_400, cell_timeout_s: 30, running_cell_id: null, owner, heartbeat_at: old, last_used_at: new Date(), ended_at: null, client_ip: null, correlation_id: null })
      .execute();
    await sql`INSERT INTO holder_leases (holder, expires_at) VALUES (${owner}, now() + interval '1 minute')`.execute(db);
    await sessions.sweep();
    expect(await db.selectFrom('sessions').select(['status', 'end_reason']).where('id', '=', 'sess-slow-owner').executeTakeFirstOrThrow()).toEqual({ status: 'ready', end_reason: null });
    await sql`UPDATE holder_leases SET expires_at = now() WHERE holder = ${owner}`.execute(db);
    await sessions.sweep();
    expect(await db.selectFrom('sessions').select(['status', 'end_reason']).where('id', '=', 'sess-slow-owner').executeTakeFirstOrThrow()).toEqual({ status: 'ended', end_reason: 'service_restart' });
  });
});
