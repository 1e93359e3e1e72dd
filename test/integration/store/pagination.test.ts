/**
 * `has_more` at the edges of a page, for the history list and the DLQ list: a page that ends exactly at
 * the last row says there is no more; one row short of the end says there is; filters count the same
 * way. (An off-by-one here passes every test that only pages through a large table.)
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb, type Db } from '../../../src/store/database.ts';
import { insertDlq, listDlq } from '../../../src/store/dlq.repository.ts';
import { listExecutions } from '../../../src/store/executions.repository.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { seedHistory } from '../../support/seed.ts';

let database: TestDatabase;
let db: Db;
const N = 10;
beforeAll(async () => {
  database = await freshDatabase();
  db = await createDb({ url: database.url, workspace: database.workspace });
  await migrateToLatest(db.kysely);
  // seed-1 … seed-10, newest last; statuses cycle through five values, job types through three.
  await seedHistory(db.kysely, N);
  for (let i = 1; i <= N; i++) {
    await insertDlq(db.kysely, {
      jobId: `job-${i}`,
      jobData: { code: 'print(1)', input_data: {}, job_type: 'default' },
      errorType: i % 2 === 0 ? 'internal_error' : 'service_unavailable',
      errorMessage: `failure ${i}`,
      retryCount: 1,
      clientIp: null,
      correlationId: null,
    });
  }
}, 120_000);
afterAll(async () => {
  await db?.destroy();
  await database?.drop();
});

// [limit, offset, rows on the page, has_more] over N = 10 rows.
const EDGES: [number, number, number, boolean][] = [
  [10, 0, 10, false], // the page is the whole table, ending exactly at its last row
  [9, 0, 9, true], // one row short of the end
  [11, 0, 10, false], // larger than the table
  [3, 7, 3, false], // a later page ending exactly at the last row
  [3, 6, 3, true], // one row before it
  [1, 9, 1, false], // the last row alone
  [5, 10, 0, false], // past the end
];

describe('listExecutions has_more', () => {
  it.each(EDGES)('limit %i offset %i → %i rows, has_more %s', async (limit, offset, count, more) => {
    const r = await listExecutions(db.kysely, { limit, offset });
    expect(r.rows).toHaveLength(count);
    expect(r.hasMore).toBe(more);
    if (count > 0) expect(r.rows[0]!.id).toBe(`seed-${N - offset}`);
  });

  it('counts within a filter: two failed rows, a page of two ends there', async () => {
    // g % 5 === 1 → 'failed': seed-1 and seed-6.
    const exact = await listExecutions(db.kysely, { status: 'failed', limit: 2, offset: 0 });
    expect(exact.rows.map((r) => r.id)).toEqual(['seed-6', 'seed-1']);
    expect(exact.hasMore).toBe(false);
    const short = await listExecutions(db.kysely, { status: 'failed', limit: 1, offset: 0 });
    expect(short.rows.map((r) => r.id)).toEqual(['seed-6']);
    expect(short.hasMore).toBe(true);
    const byType = await listExecutions(db.kysely, { jobType: 'data', limit: 3, offset: 0 });
    // g % 3 === 1 → 'data': seed-1, seed-4, seed-7, seed-10.
    expect(byType.rows.map((r) => r.id)).toEqual(['seed-10', 'seed-7', 'seed-4']);
    expect(byType.hasMore).toBe(true);
    const both = await listExecutions(db.kysely, { status: 'failed', jobType: 'data', limit: 1, offset: 0 });
    expect(both.rows.map((r) => r.id)).toEqual(['seed-1']);
    expect(both.hasMore).toBe(false);
  });

  it('a job type no text can equal (NUL) is an empty page, not a database error', async () => {
    expect(await listExecutions(db.kysely, { jobType: 'a\u0000b', limit: 5, offset: 0 })).toEqual({ rows: [], hasMore: false });
  });
});

describe('listDlq has_more', () => {
  it.each(EDGES)('limit %i offset %i → %i entries, has_more %s', async (limit, offset, count, more) => {
    const r = await listDlq(db.kysely, { limit, offset });
    expect(r.rows).toHaveLength(count);
    expect(r.hasMore).toBe(more);
    if (count > 0) expect(r.rows[0]!.job_id).toBe(`job-${N - offset}`);
  });

  it('counts within an error type: five of each, a page of five ends there', async () => {
    const exact = await listDlq(db.kysely, { errorType: 'internal_error', limit: 5, offset: 0 });
    expect(exact.rows.map((r) => r.job_id)).toEqual(['job-10', 'job-8', 'job-6', 'job-4', 'job-2']);
    expect(exact.hasMore).toBe(false);
    const short = await listDlq(db.kysely, { errorType: 'internal_error', limit: 4, offset: 0 });
    expect(short.hasMore).toBe(true);
  });

  it('an error type no text can equal (NUL) is an empty page, not a database error', async () => {
    expect(await listDlq(db.kysely, { errorType: 'a\u0000b', limit: 5, offset: 0 })).toEqual({ rows: [], hasMore: false });
  });
});
