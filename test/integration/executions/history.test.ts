/**
 * The API's read model (`src/executions/history.ts`) on a real database: queue statistics per job type
 * with an injected clock, the `pending` alias, positions, views, input artifacts and the DLQ.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { History } from '../../../src/executions/history.ts';
import { createDb, type Db } from '../../../src/store/database.ts';
import { insertDlq } from '../../../src/store/dlq.repository.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';

let database: TestDatabase;
let db: Db;
let history: History;
const T0 = Date.parse('2026-01-01T00:00:00.000Z');

async function row(id: string, status: string, jobType: string, createdMs: number): Promise<void> {
  await sql`
    INSERT INTO executions (id, status, mode, job_type, job_version, job_ref, code, input_data, code_hash, input_hash,
                            timeout_s, startup_timeout_s, requirements, created_at)
    VALUES (${id}, ${status}, 'async', ${jobType}, 'latest', 'default@sha256:0', 'print(1)', '{"a":1}'::jsonb,
            ${'c'.repeat(64)}, ${'i'.repeat(64)}, 30, 60, '[]'::jsonb, ${new Date(T0 + createdMs)})`.execute(db.kysely);
}

beforeAll(async () => {
  database = await freshDatabase();
  db = await createDb({ url: database.url, workspace: database.workspace });
  await migrateToLatest(db.kysely);
  history = new History(db, { now: () => T0 + 10_000 });
  await row('q1', 'queued', 'default', 1_000);
  await row('q2', 'queued', 'data', 2_000);
  await row('q3', 'queued', 'default', 3_000);
  await row('r1', 'running', 'data', 500);
  await row('s1', 'succeeded', 'default', 0);
});
afterAll(async () => {
  await db?.destroy();
  await database?.drop();
});

describe('History', () => {
  it('queue statistics: totals, per job type, and the oldest queued age from the clock', async () => {
    expect(await history.queueStats()).toEqual({
      queued: 3,
      running: 1,
      oldest_queued_age_ms: 9_000,
      by_job_type: { default: { queued: 2, running: 0 }, data: { queued: 1, running: 1 } },
    });
    expect(await history.queueCounts()).toEqual({ queued: 3, running: 1 });
  });

  it('queue positions are 1-based among queued records; others have none', async () => {
    expect(await history.queuePosition('q1')).toBe(1);
    expect(await history.queuePosition('q3')).toBe(3);
    expect(await history.queuePosition('r1')).toBeNull();
  });

  it('lists newest first; the filter pending means queued', async () => {
    const page = await history.list({ status: 'pending', limit: 2, offset: 0, full: false });
    expect(page).toMatchObject({ limit: 2, offset: 0, count: 2, has_more: true });
    expect(page.items.map((r) => r.execution_id)).toEqual(['q3', 'q2']);
    const rest = await history.list({ status: 'queued', jobType: 'default', limit: 10, offset: 1, full: true });
    expect(rest.items.map((r) => r.execution_id)).toEqual(['q1']);
    expect(rest.items[0]).toHaveProperty('input_artifacts');
  });

  it('status and record views of one record; input artifacts come from the record', async () => {
    const r = (await history.find('q1'))!;
    expect(history.statusOf(r)).toEqual({ job_id: 'q1', status: 'queued', job_type: 'default', created_at: '2026-01-01T00:00:01.000Z', started_at: null, ended_at: null });
    expect(await history.recordOf(r, false)).not.toHaveProperty('code_hash');
    expect(await history.recordOf(r, true)).toMatchObject({ code_hash: 'c'.repeat(64), artifacts: [] });
    const code = await history.artifact(r, '_code.py', true);
    expect(code?.data?.toString()).toBe('print(1)');
    expect(await history.artifact(r, 'nope.txt', true)).toBeUndefined();
    expect(await history.find('missing')).toBeUndefined();
  });

  it('dead letter queue: page, stats, delete once', async () => {
    for (const t of ['internal_error', 'internal_error', 'docker_error']) {
      await insertDlq(db.kysely, { jobId: 'r1', jobData: { code: 'x', input_data: {}, job_type: 'data' }, errorType: t, errorMessage: 'm', retryCount: 0, clientIp: null, correlationId: null });
    }
    expect(await history.dlqStats()).toEqual({ total: 3, by_error_type: { internal_error: 2, docker_error: 1 } });
    const page = await history.dlqPage({ errorType: 'internal_error', limit: 1, offset: 0 });
    expect(page).toMatchObject({ count: 1, has_more: true });
    expect(page.items[0]).toMatchObject({ job_id: 'r1', error_type: 'internal_error', job_data: { job_type: 'data' } });
    expect(page.items[0]!.created_at).toMatch(/Z$/);
    expect(await history.deleteDlq(page.items[0]!.id)).toBe(true);
    expect(await history.deleteDlq(page.items[0]!.id)).toBe(false);
  });

  it('ping answers and kind names the database', async () => {
    await expect(history.ping()).resolves.toBeUndefined();
    expect(history.kind).toBe(database.kind);
  });
});
