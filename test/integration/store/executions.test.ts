/**
 * The batched insert of async submissions (one array per column through unnest): every column
 * arrives as given (json columns as the exact text, numbers included), a batch is all or nothing, and with a channel the same statement wakes that
 * channel's listeners — once per batch — on PostgreSQL and on PGlite.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql, type Kysely } from 'kysely';
import { createDb, type Database, type Db, type NewExecutionRow } from '../../../src/store/database.ts';
import { EXECUTION_COLUMN_TYPES, insertExecution, insertExecutions, settleRunning } from '../../../src/store/executions.repository.ts';
import { insertDlq } from '../../../src/store/dlq.repository.ts';
import { parseJson, stringifyJson } from '../../../src/util/json.ts';
import { connectionPair, freshDatabase, type TestDatabase } from '../../support/db.ts';
import { newRow } from '../../support/rows.ts';

let database: TestDatabase;
let listener: Db;
let writer: Db;
let closePair: () => Promise<void>;
beforeAll(async () => {
  database = await freshDatabase();
  ({ listener, writer, close: closePair } = await connectionPair(database));
});
afterAll(async () => {
  await closePair?.();
  await database?.drop();
});

function row(id: string, extra: Partial<NewExecutionRow> = {}): NewExecutionRow {
  return newRow(id, {
    code: `print(${JSON.stringify(id)})`,
    idempotency_key: null,
    parent_execution_id: null,
    created_at: new Date('2026-01-02T03:04:05.678Z'),
    started_at: null,
    attempts: 0,
    ...extra,
  });
}

describe('insertExecutions', () => {
  it("casts each column to the table's own type: the map of non-text columns matches the schema", async () => {
    const cols = await sql<{ column_name: string; data_type: string }>`
      SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'executions' AND data_type <> 'text'`.execute(listener.kysely);
    const pgName: Record<string, string> = { 'timestamp with time zone': 'timestamptz' };
    const fromSchema = Object.fromEntries(cols.rows.map((c) => [c.column_name, pgName[c.data_type] ?? c.data_type]));
    expect(EXECUTION_COLUMN_TYPES).toEqual(fromSchema);
  });

  it('writes every column of every row as given: text with quotes, braces and backslashes, JSON, numbers, times, nulls', async () => {
    const awkward = 'print("a,b{c}\\d\'e")\n# NULL \u00e9\u4e2d\ud83d\ude00 "quoted" {"x": [1]}\n';
    await insertExecutions(writer.kysely, [
      row('t-1', { code: awkward, input_data: JSON.stringify({ nested: { list: [1, 'two', null], s: 'a"b\\c' } }), requirements: JSON.stringify(['numpy>=1.26,<2']) }),
      row('t-2', { started_at: new Date('2026-01-02T03:04:06.000Z'), attempts: 1, parent_execution_id: 't-1', relationship: 'fork', timeout_s: 5 }),
    ]);
    const got = await listener.kysely.selectFrom('executions').selectAll().where('id', 'in', ['t-1', 't-2']).orderBy('id').execute();
    expect(got.map((r) => r.id)).toEqual(['t-1', 't-2']);
    expect(got[0]!.code).toBe(awkward);
    expect(got[0]!.input_data).toEqual({ nested: { list: [1, 'two', null], s: 'a"b\\c' } });
    expect(got[0]!.requirements).toEqual(['numpy>=1.26,<2']);
    expect(new Date(got[0]!.created_at).toISOString()).toBe('2026-01-02T03:04:05.678Z');
    expect([got[0]!.started_at, got[0]!.idempotency_key, got[0]!.parent_execution_id, got[0]!.stdout_truncated, got[0]!.cancel_requested]).toEqual([null, null, null, false, false]);
    expect([new Date(got[1]!.started_at!).toISOString(), got[1]!.attempts, got[1]!.parent_execution_id, got[1]!.relationship, got[1]!.timeout_s]).toEqual([
      '2026-01-02T03:04:06.000Z',
      1,
      't-1',
      'fork',
      5,
    ]);
  });

  it('json columns (json, not jsonb) keep the text as written and read numbers back exactly', async () => {
    const text = '{"big":12345678901234567890,"dec":0.1000000000000000055511151231257827,"f":1.0,"e":1e400,"z":-0,"s":"a\\u0000b"}';
    await insertExecutions(writer.kysely, [row('x-1', { input_data: text, output: text })]);
    await insertExecution(writer.kysely, row('x-2', { input_data: text, output: text }));
    const dlq = await insertDlq(writer.kysely, { jobId: 'x-2', jobData: { code: 'print(1)', input_data: parseJson(text), job_type: 'default' }, errorType: 'internal_error', errorMessage: 'm', retryCount: 0, clientIp: null, correlationId: null });
    const types = await sql<{ table_name: string; column_name: string; data_type: string }>`
      SELECT table_name, column_name, data_type FROM information_schema.columns
      WHERE (table_name = 'executions' AND column_name IN ('input_data', 'output', 'requirements', 'error', 'timing', 'resource_usage', 'stdout', 'stderr'))
         OR (table_name = 'dlq' AND column_name = 'job_data')`.execute(listener.kysely);
    expect(types.rows).toHaveLength(9);
    for (const c of types.rows) expect(c.data_type, `${c.table_name}.${c.column_name}`).toBe('json');
    for (const id of ['x-1', 'x-2']) {
      const raw = await sql<{ input_data: string; output: string }>`SELECT input_data::text AS input_data, output::text AS output FROM executions WHERE id = ${id}`.execute(listener.kysely);
      expect(raw.rows[0], id).toEqual({ input_data: text, output: text });
      const got = await listener.kysely.selectFrom('executions').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
      expect(stringifyJson(got.input_data), id).toBe(text);
      expect(stringifyJson(got.output), id).toBe(text);
    }
    const entry = await listener.kysely.selectFrom('dlq').selectAll().where('id', '=', dlq.id).executeTakeFirstOrThrow();
    expect(stringifyJson((entry.job_data as { input_data: unknown }).input_data)).toBe(text);
  });

  it('is all or nothing: a batch with a duplicate id inserts none of its rows', async () => {
    await expect(insertExecutions(writer.kysely, [row('d-1'), row('t-1')])).rejects.toThrow();
    expect(await listener.kysely.selectFrom('executions').select('id').where('id', '=', 'd-1').execute()).toEqual([]);
  });

  it('with a channel, the statement itself notifies it once; without, not at all', async () => {
    const got: string[] = [];
    const unlisten = await listener.listen('test_queued', (p) => got.push(p));
    try {
      await insertExecutions(writer.kysely, [row('b-2'), row('b-1'), row('b-3')], 'test_queued');
      const end = Date.now() + 5_000;
      while (got.length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      await new Promise((r) => setTimeout(r, 200));
      // Identical payloads in one transaction are delivered once.
      expect(got).toEqual(['']);
      await insertExecutions(writer.kysely, [row('c-1')]);
      await new Promise((r) => setTimeout(r, 300));
      expect(got).toEqual(['']);
      expect((await listener.kysely.selectFrom('executions').select('id').where('id', 'in', ['b-1', 'b-2', 'b-3', 'c-1']).execute()).length).toBe(4);
    } finally {
      await unlisten();
    }
  });
});

describe('insertExecution with flushLater (a sync run record)', () => {
  it('returns the row as inserted, and the commit setting it lowers is that transaction’s alone', async () => {
    await writer.kysely.connection().execute(async (conn) => {
      const showCommit = async () => (await sql<{ synchronous_commit: string }>`SHOW synchronous_commit`.execute(conn)).rows[0]!.synchronous_commit;
      expect(await showCommit()).toBe('on');
      const inserted = await insertExecution(conn, row('flush-1', { status: 'running', mode: 'sync' }), { flushLater: true });
      expect(inserted.id).toBe('flush-1');
      expect(inserted.status).toBe('running');
      expect(Object.keys(inserted)).not.toContain('unflushed');
      // Its own statement was the whole transaction: the next commit on this connection waits for the disk again.
      expect(await showCommit()).toBe('on');
      // Inside a transaction the setting holds until its end (which is why callers must not pass one).
      await conn.transaction().execute(async (tx) => {
        await insertExecution(tx, row('flush-2'), { flushLater: true });
        expect((await sql<{ synchronous_commit: string }>`SHOW synchronous_commit`.execute(tx)).rows[0]!.synchronous_commit).toBe('off');
      });
      expect(await showCommit()).toBe('on');
    });
    const stored = await writer.kysely.selectFrom('executions').select(['id', 'status']).where('id', 'in', ['flush-1', 'flush-2']).orderBy('id').execute();
    expect(stored).toEqual([
      { id: 'flush-1', status: 'running' },
      { id: 'flush-2', status: 'queued' },
    ]);
  });
});

describe('prepared statements (PostgreSQL)', () => {
  const preparedNames = async (conn: Kysely<Database>) => (await sql<{ name: string }>`SELECT name FROM pg_prepared_statements`.execute(conn)).rows.map((r) => r.name);
  const settle = (conn: Kysely<Database>, id: string) =>
    settleRunning(conn, id, 'me', { status: 'succeeded', exit_code: 0, claimed_by: null }, 'sandpod_test_done', { list: [{ kind: 'status', data: '{"s":1}' }], channel: 'sandpod_test_events' });

  it.runIf(process.env.SANDPOD_TEST_DB !== 'pglite')('a sync run’s insert and every verdict are prepared once per connection and reused', async () => {
    await writer.kysely.connection().execute(async (conn) => {
      const run = async (id: string) => {
        await insertExecution(conn, row(id, { status: 'running', mode: 'sync', claimed_by: 'me' }), { flushLater: true });
        expect((await settle(conn, id))?.status).toBe('succeeded');
        return (await sql<{ name: string; statement: string }>`SELECT name, statement FROM pg_prepared_statements WHERE name LIKE 'sandpod\_%' ORDER BY name`.execute(conn)).rows;
      };
      const first = await run('prep-1');
      expect(first.some((p) => p.statement.startsWith('insert into "executions"'))).toBe(true);
      expect(first.some((p) => p.statement.startsWith('with "u" as (update "executions"'))).toBe(true);
      // The next run reuses them: nothing new is prepared.
      expect(await run('prep-2')).toEqual(first);
    });
  });

  it.runIf(process.env.SANDPOD_TEST_DB !== 'pglite')('with database_prepared_statements off, nothing is prepared (for poolers that cannot carry them)', async () => {
    const plain = await createDb({ url: database.url, workspace: database.workspace, preparedStatements: false });
    try {
      await plain.kysely.connection().execute(async (conn) => {
        await insertExecution(conn, row('prep-3', { status: 'running', mode: 'sync', claimed_by: 'me' }), { flushLater: true });
        expect((await settle(conn, 'prep-3'))?.status).toBe('succeeded');
        expect(await preparedNames(conn)).toEqual([]);
      });
    } finally {
      await plain.destroy();
    }
  });
});
