/**
 * History queries stay index-driven as the table grows (issue 3: fast at a million rows; the
 * latency at 1M rows is in `make bench`). Checked with EXPLAIN on a table big enough for the planner
 * to prefer indexes: no sequential scan and no sort for any filter combination the API offers — on
 * the statement `listExecutions` itself sends (captured as kysely compiles it), not a copy of it.
 */
import { CompiledQuery, sql, type KyselyPlugin, type RootOperationNode } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb, type Db } from '../../../src/store/database.ts';
import { migrateToLatest } from '../../../src/store/migrate.ts';
import { listExecutions, type ListFilter } from '../../../src/store/executions.repository.ts';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { seedHistory } from '../../support/seed.ts';

let database: TestDatabase;
let db: Db;
beforeAll(async () => {
  database = await freshDatabase();
  db = await createDb({ url: database.url, workspace: database.workspace });
  await migrateToLatest(db.kysely);
  await seedHistory(db.kysely, 60_000);
}, 180_000);
afterAll(async () => {
  await db?.destroy();
  await database?.drop();
});

async function plan(where: string, offset = 0): Promise<string> {
  const r = await sql
    .raw<{ 'QUERY PLAN': string }>(`EXPLAIN SELECT * FROM executions ${where} ORDER BY created_at DESC, id DESC LIMIT 101 OFFSET ${offset}`)
    .execute(db.kysely);
  return r.rows.map((x) => x['QUERY PLAN']).join('\n');
}

/**
 * Calls `listExecutions` and returns the statement it sent (SQL text and parameters as kysely
 * compiled them) with its rows.
 */
async function sentBy(filter: ListFilter): Promise<{ sql: string; parameters: readonly unknown[]; rows: number }> {
  const nodes: { node: RootOperationNode; queryId: Parameters<KyselyPlugin['transformQuery']>[0]['queryId'] }[] = [];
  const capture: KyselyPlugin = {
    transformQuery: (args) => {
      nodes.push({ node: args.node, queryId: args.queryId });
      return args.node;
    },
    transformResult: async (args) => args.result,
  };
  const { rows } = await listExecutions(db.kysely.withPlugin(capture), filter);
  expect(nodes).toHaveLength(1);
  const compiled = db.kysely.getExecutor().compileQuery(nodes[0]!.node, nodes[0]!.queryId);
  return { sql: compiled.sql, parameters: compiled.parameters, rows: rows.length };
}

/** EXPLAIN of a compiled statement, with its own parameters. */
async function planOf(q: { sql: string; parameters: readonly unknown[] }): Promise<string> {
  const r = await db.kysely.executeQuery<{ 'QUERY PLAN': string }>(CompiledQuery.raw(`EXPLAIN ${q.sql}`, [...q.parameters]));
  return r.rows.map((x) => x['QUERY PLAN']).join('\n');
}

describe('the statement listExecutions sends', () => {
  it.each<[string, ListFilter, string, unknown[]]>([
    ['no filter', { limit: 100, offset: 0 }, '', [101, 0]],
    ['status', { status: 'failed', limit: 100, offset: 200 }, 'where "status" = $1 ', ['failed', 101, 200]],
    ['job_type', { jobType: 'data', limit: 20, offset: 0 }, 'where "job_type" = $1 ', ['data', 21, 0]],
    ['both', { status: 'failed', jobType: 'data', limit: 5, offset: 5 }, 'where "status" = $1 and "job_type" = $2 ', ['failed', 'data', 6, 5]],
  ])('%s: newest first, one row past the page, and an index scan with no sort', async (label, filter, where, parameters) => {
    const q = await sentBy(filter);
    const n = parameters.length;
    expect(q.sql).toBe(`select * from "executions" ${where}order by "created_at" desc, "id" desc limit $${n - 1} offset $${n}`);
    expect(q.parameters).toEqual(parameters);
    expect(q.rows).toBe(filter.limit);
    const p = await planOf(q);
    expect(p).not.toMatch(/Seq Scan/);
    if (label !== 'both') {
      expect(p).toMatch(/Index Scan/);
      expect(p).not.toMatch(/\bSort\b/);
    }
  });
});

describe('history indexes', () => {
  it.each([
    ['no filter', ''],
    ['status', "WHERE status = 'failed'"],
    ['job_type', "WHERE job_type = 'data'"],
  ])('%s: an index scan in order, no seq scan, no sort', async (_label, where) => {
    const p = await plan(where);
    expect(p).toMatch(/Index Scan/);
    expect(p).not.toMatch(/Seq Scan/);
    expect(p).not.toMatch(/\bSort\b/);
  });

  it('both filters still avoid a sort over the table', async () => {
    const p = await plan("WHERE status = 'failed' AND job_type = 'data'");
    expect(p).not.toMatch(/Seq Scan/);
  });

  it('pages newest first without gaps or repeats', async () => {
    const a = await listExecutions(db.kysely, { limit: 50, offset: 0 });
    const b = await listExecutions(db.kysely, { limit: 50, offset: 50 });
    expect(a.hasMore).toBe(true);
    const ids = [...a.rows, ...b.rows].map((r) => r.id);
    expect(new Set(ids).size).toBe(100);
    expect(ids[0]).toBe('seed-60000');
    expect(ids[99]).toBe('seed-59901');
  });
});
