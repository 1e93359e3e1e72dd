/**
 * The repositories (src/store/*.repository.ts) one function at a time against a real database: what
 * each writes and reads back, the guards of the updates, the counts and positions of the queue, and
 * the artifact and DLQ stores, and the job-type build records with their lease. (Batched inserts: store/executions.test.ts; `has_more`:
 * store/pagination.test.ts.)
 */
import { beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { getArtifact, insertArtifacts, listArtifacts, listArtifactsFor, type NewArtifact } from '../../../src/store/artifacts.repository.ts';
import { buildingOf, builtBuilds, expireStaleBuild, finishBuild, getBuild, insertBuilding, listBuilds, updateBuildPhase, type NewBuild } from '../../../src/store/builds.repository.ts';
import type { Db, NewExecutionRow } from '../../../src/store/database.ts';
import { deleteDlq, dlqStats, insertDlq, listDlq } from '../../../src/store/dlq.repository.ts';
import { appendEvents, eventsAfter } from '../../../src/store/events.repository.ts';
import {
  activeCountUpTo,
  canMatchText,
  getExecution,
  insertExecution,
  insertExecutions,
  insertIdempotent,
  liveIds,
  queueCounts,
  queuePosition,
  settleRunning,
  updateExecutionIf,
} from '../../../src/store/executions.repository.ts';
import { usePairedDatabase } from '../../support/paired-db.ts';
import { newRow } from '../../support/rows.ts';

const pair = usePairedDatabase(['artifacts', 'executions', 'dlq', 'job_type_builds', 'execution_events']);
let db: Db;
let other: Db;
beforeAll(() => {
  ({ db, other } = pair);
});

const T0 = Date.parse('2026-05-06T07:08:09.000Z');

function rec(id: string, extra: Partial<NewExecutionRow> = {}): NewExecutionRow {
  return newRow(id, { code: `print(${JSON.stringify(id)})`, input_data: '{"n":1}', code_hash: 'c', input_hash: 'i', created_at: new Date(T0), ...extra });
}

const ids = (rows: { id: string }[]) => rows.map((r) => r.id);

describe('executions: insert and read', () => {
  it('insertExecution returns the stored record; getExecution reads it, and nothing for an unknown id', async () => {
    const stored = await insertExecution(db.kysely, rec('e1', { idempotency_key: 'k', correlation_id: 'corr' }));
    expect(stored).toMatchObject({ id: 'e1', status: 'queued', input_data: { n: 1 }, idempotency_key: 'k', correlation_id: 'corr', attempts: 0, cancel_requested: false });
    expect(await getExecution(db.kysely, 'e1')).toEqual(stored);
    expect(await getExecution(db.kysely, 'e2')).toBeUndefined();
  });

  it('an id with NUL names no record: undefined, not a database error', async () => {
    expect(canMatchText('a\u0000b')).toBe(false);
    expect(canMatchText('ab')).toBe(true);
    expect(await getExecution(db.kysely, 'e1\u0000')).toBeUndefined();
  });

  it('insertExecutions of no rows writes nothing and does not fail', async () => {
    await expect(insertExecutions(db.kysely, [])).resolves.toBeUndefined();
    expect(await db.kysely.selectFrom('executions').select('id').execute()).toEqual([]);
  });
});

describe('insertIdempotent', () => {
  it('creates the first record of a key, then answers that record (created: false) for the key again', async () => {
    const first = await insertIdempotent(db.kysely, rec('k1', { idempotency_key: 'key-1', payload_hash: 'p1' }));
    expect(first.created).toBe(true);
    expect(first.row).toMatchObject({ id: 'k1', idempotency_key: 'key-1', payload_hash: 'p1' });

    const again = await insertIdempotent(db.kysely, rec('k2', { idempotency_key: 'key-1', payload_hash: 'p2', code: 'other' }));

    expect(again).toEqual({ row: first.row, created: false });
    expect(ids(await db.kysely.selectFrom('executions').select('id').execute())).toEqual(['k1']);
  });

  it('records without a key never conflict with each other', async () => {
    const a = await insertIdempotent(db.kysely, rec('n1', { idempotency_key: null }));
    const b = await insertIdempotent(db.kysely, rec('n2', { idempotency_key: null }));
    expect([a.created, a.row.id, b.created, b.row.id]).toEqual([true, 'n1', true, 'n2']);
  });

  it('two concurrent first submissions of one key create one record, from two connections', async () => {
    const [a, b] = await Promise.all([
      insertIdempotent(db.kysely, rec('r1', { idempotency_key: 'race' })),
      insertIdempotent(other.kysely, rec('r2', { idempotency_key: 'race' })),
    ]);
    expect([a.created, b.created].sort()).toEqual([false, true]);
    expect(a.row.id).toBe(b.row.id);
  });
});

describe('updateExecutionIf', () => {
  it('updates only from the given statuses and returns the new record', async () => {
    await insertExecution(db.kysely, rec('u1'));
    expect(await updateExecutionIf(db.kysely, 'u1', ['running'], { status: 'failed' })).toBeUndefined();
    expect((await getExecution(db.kysely, 'u1'))?.status).toBe('queued');

    const u = await updateExecutionIf(db.kysely, 'u1', ['running', 'queued'], { status: 'cancelled', exit_code: 3 });

    expect(u).toMatchObject({ id: 'u1', status: 'cancelled', exit_code: 3 });
    expect(await getExecution(db.kysely, 'u1')).toEqual(u);
  });

  it('with a holder, only while that process holds it; only the record named', async () => {
    await insertExecution(db.kysely, rec('h1', { status: 'running', claimed_by: 'w1' }));
    await insertExecution(db.kysely, rec('h2', { status: 'running', claimed_by: 'w1' }));
    expect(await updateExecutionIf(db.kysely, 'h1', ['running'], { status: 'failed' }, 'w2')).toBeUndefined();
    expect(await updateExecutionIf(db.kysely, 'h1', ['running'], { status: 'failed' }, 'w1')).toMatchObject({ id: 'h1', status: 'failed' });
    expect((await getExecution(db.kysely, 'h2'))?.status).toBe('running');
  });
});

describe('settleRunning', () => {
  it('settles a running record of its holder and notifies the channel with its id, in one statement', async () => {
    await insertExecution(db.kysely, rec('s1', { status: 'running', claimed_by: 'w1' }));
    await insertExecution(db.kysely, rec('s2', { status: 'running', claimed_by: 'w1' }));
    const got: string[] = [];
    const unlisten = await other.listen('test_done', (p) => got.push(p));
    try {
      const settled = await settleRunning(db.kysely, 's1', 'w1', { status: 'succeeded', exit_code: 0 }, 'test_done');

      expect(settled).toEqual(await getExecution(db.kysely, 's1'));
      expect(settled).toMatchObject({ status: 'succeeded', exit_code: 0 });
      expect(settled).not.toHaveProperty('notified');
      const end = Date.now() + 5000;
      while (got.length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      expect(got).toEqual(['s1']);
      expect((await getExecution(db.kysely, 's2'))?.status).toBe('running');
    } finally {
      await unlisten();
    }
  });

  it("stores the run's last events with the verdict, after the ones written before, and notifies their channel", async () => {
    await insertExecution(db.kysely, rec('ev', { status: 'running', claimed_by: 'w1' }));
    await appendEvents(db.kysely, 'ev', [{ kind: 'status', data: '{"phase":"running"}' }]);
    const got: string[] = [];
    const unlisten = await other.listen('test_events', (p) => got.push(p));
    try {
      // NUL (as JSON escapes it), quotes, braces and a backslash: stored as written.
      const last = [
        { kind: 'stdout', data: JSON.stringify({ data: 'a\u0000b "q" {x} \\' }) },
        { kind: 'stderr', data: JSON.stringify({ data: 'e' }) },
      ];
      expect(await settleRunning(db.kysely, 'ev', 'w1', { status: 'succeeded' }, 'test_done', { list: last, channel: 'test_events' })).toMatchObject({ status: 'succeeded' });
      const stored = await eventsAfter(db.kysely, 'ev', 0, 10);
      expect(stored.map((e) => [e.kind, e.data])).toEqual([['status', '{"phase":"running"}'], ...last.map((e) => [e.kind, e.data])]);
      expect(stored[1]!.id).toBeGreaterThan(stored[0]!.id);
      expect(stored[2]!.id).toBeGreaterThan(stored[1]!.id);
      const end = Date.now() + 5000;
      while (got.length === 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      expect(got).toEqual(['ev']);
    } finally {
      await unlisten();
    }
  });

  it('stores no events for a record it does not settle, and notifies no event channel without events', async () => {
    await insertExecution(db.kysely, rec('held', { status: 'running', claimed_by: 'w2' }));
    await insertExecution(db.kysely, rec('plain', { status: 'running', claimed_by: 'w1' }));
    const got: string[] = [];
    const unlisten = await other.listen('test_events', (p) => got.push(p));
    try {
      expect(await settleRunning(db.kysely, 'held', 'w1', { status: 'failed' }, 'test_done', { list: [{ kind: 'stdout', data: '{"data":"x"}' }], channel: 'test_events' })).toBeUndefined();
      expect(await eventsAfter(db.kysely, 'held', 0, 10)).toEqual([]);
      expect(await settleRunning(db.kysely, 'plain', 'w1', { status: 'succeeded' }, 'test_done', { list: [], channel: 'test_events' })).toMatchObject({ status: 'succeeded' });
      await new Promise((r) => setTimeout(r, 300));
      expect(got).toEqual([]);
    } finally {
      await unlisten();
    }
  });

  it('does nothing to a record that is not running, or held by another process', async () => {
    await insertExecution(db.kysely, rec('q', { status: 'queued', claimed_by: 'w1' }));
    await insertExecution(db.kysely, rec('o', { status: 'running', claimed_by: 'w2' }));
    expect(await settleRunning(db.kysely, 'q', 'w1', { status: 'failed' }, 'test_done')).toBeUndefined();
    expect(await settleRunning(db.kysely, 'o', 'w1', { status: 'failed' }, 'test_done')).toBeUndefined();
    expect([(await getExecution(db.kysely, 'q'))?.status, (await getExecution(db.kysely, 'o'))?.status]).toEqual(['queued', 'running']);
  });
});

describe('queue depth and positions', () => {
  beforeEach(async () => {
    // Queued a (oldest), b and c (same time: by id), d; running r1, r2; finished ones.
    await db.kysely
      .insertInto('executions')
      .values([
        rec('d', { created_at: new Date(T0 + 3) }),
        rec('c', { created_at: new Date(T0 + 2) }),
        rec('b', { created_at: new Date(T0 + 2) }),
        rec('a', { created_at: new Date(T0 + 1) }),
        rec('r1', { status: 'running', created_at: new Date(T0) }),
        rec('r2', { status: 'running', created_at: new Date(T0 + 5) }),
        ...['succeeded', 'failed', 'timeout', 'oom', 'cancelled'].map((s) => rec(`t-${s}`, { status: s, created_at: new Date(T0) })),
      ])
      .execute();
  });

  it('queueCounts counts queued and running records', async () => {
    expect(await queueCounts(db.kysely)).toEqual({ queued: 4, running: 2 });
  });

  it.each([
    [100, 6],
    [6, 6],
    [5, 5],
    [1, 1],
  ])('activeCountUpTo(%i) counts queued and running up to the cap: %i', async (cap, n) => {
    expect(await activeCountUpTo(db.kysely, cap)).toBe(n);
  });

  it('queuePosition is the 1-based place among queued records, oldest first, ties by id', async () => {
    const positions = await Promise.all(['a', 'b', 'c', 'd'].map((id) => queuePosition(db.kysely, id)));
    expect(positions).toEqual([1, 2, 3, 4]);
  });

  it('queuePosition is null for a record that is not queued, or unknown', async () => {
    expect(await queuePosition(db.kysely, 'r1')).toBeNull();
    expect(await queuePosition(db.kysely, 't-succeeded')).toBeNull();
    expect(await queuePosition(db.kysely, 'nope')).toBeNull();
  });

  it('liveIds keeps the ids whose record is queued or running', async () => {
    const live = await liveIds(db.kysely, ['a', 'r2', 't-succeeded', 't-failed', 't-timeout', 't-oom', 't-cancelled', 'unknown']);
    expect([...live].sort()).toEqual(['a', 'r2']);
    expect(await liveIds(db.kysely, [])).toEqual(new Set());
  });
});

describe('artifacts', () => {
  const art = (executionId: string, kind: 'output' | 'input', name: string, extra: Partial<NewArtifact> = {}): NewArtifact => ({
    executionId,
    kind,
    name,
    sizeBytes: 3,
    sha256: `sha-${name}`,
    contentType: 'text/plain',
    data: Buffer.from(`${kind}:${name}`),
    skipped: null,
    ...extra,
  });
  const META = ['content_type', 'created_at', 'execution_id', 'kind', 'name', 'sha256', 'size_bytes', 'skipped', 'source_execution_id', 'source_name'];

  beforeEach(async () => {
    await db.kysely.insertInto('executions').values([rec('x1'), rec('x2'), rec('x3')]).execute();
  });

  it('insertArtifacts of none writes nothing and does not fail', async () => {
    await expect(insertArtifacts(db.kysely, [])).resolves.toBeUndefined();
    expect(await listArtifacts(db.kysely, 'x1')).toEqual([]);
  });

  it('stores every field; a second artifact with the same execution, kind and name keeps the first', async () => {
    await insertArtifacts(db.kysely, [art('x1', 'output', 'r.csv', { sizeBytes: 12, sha256: 'abc', contentType: 'text/csv', data: Buffer.from([0, 1, 255]) })]);
    await insertArtifacts(db.kysely, [art('x1', 'output', 'r.csv', { data: Buffer.from('second') }), art('x1', 'output', 'big.bin', { data: null, skipped: 'too_large' })]);

    const one = await getArtifact(db.kysely, 'x1', 'r.csv', true);

    expect(one).toMatchObject({ execution_id: 'x1', kind: 'output', name: 'r.csv', size_bytes: 12, sha256: 'abc', content_type: 'text/csv', skipped: null });
    expect([...one!.data!]).toEqual([0, 1, 255]);
    expect((await listArtifacts(db.kysely, 'x1')).map((a) => [a.name, a.skipped])).toEqual([
      ['big.bin', 'too_large'],
      ['r.csv', null],
    ]);
  });

  it('listArtifacts: one execution’s, without bytes, by kind then name', async () => {
    await insertArtifacts(db.kysely, [art('x1', 'output', 'b'), art('x1', 'input', 'z'), art('x1', 'output', 'a'), art('x1', 'input', 'c'), art('x2', 'output', 'a')]);
    const list = await listArtifacts(db.kysely, 'x1');
    expect(list.map((a) => `${a.kind}/${a.name}`)).toEqual(['input/c', 'input/z', 'output/a', 'output/b']);
    for (const a of list) expect(Object.keys(a).sort()).toEqual(META);
  });

  it('listArtifactsFor: the named executions’ only, without bytes, by name; nothing for no ids', async () => {
    await insertArtifacts(db.kysely, [art('x1', 'output', 'm'), art('x2', 'output', 'b'), art('x3', 'output', 'a'), art('x2', 'input', 'z')]);
    const list = await listArtifactsFor(db.kysely, ['x1', 'x2']);
    expect(list.map((a) => `${a.execution_id}/${a.name}`)).toEqual(['x2/b', 'x1/m', 'x2/z']);
    for (const a of list) expect(Object.keys(a).sort()).toEqual(META);
    expect(await listArtifactsFor(db.kysely, [])).toEqual([]);
  });

  it('getArtifact: bytes only when asked; never a skipped one; output before input of one name; nothing unknown', async () => {
    await insertArtifacts(db.kysely, [
      art('x1', 'input', 'same'),
      art('x1', 'output', 'same'),
      art('x1', 'output', 'skipped', { data: null, skipped: 'too_large' }),
      art('x2', 'output', 'elsewhere'),
    ]);
    // PGlite hands bytea back as a Uint8Array, PostgreSQL as a Buffer: compare the bytes.
    const bytes = (await getArtifact(db.kysely, 'x1', 'same', true))?.data;
    expect(bytes && Buffer.from(bytes).toString()).toBe('output:same');
    const meta = await getArtifact(db.kysely, 'x1', 'same', false);
    expect(meta).toMatchObject({ execution_id: 'x1', kind: 'output', name: 'same', sha256: 'sha-same', data: null });
    expect(await getArtifact(db.kysely, 'x1', 'skipped', true)).toBeUndefined();
    expect(await getArtifact(db.kysely, 'x1', 'skipped', false)).toBeUndefined();
    expect(await getArtifact(db.kysely, 'x1', 'elsewhere', false)).toBeUndefined();
    expect(await getArtifact(db.kysely, 'x1', 'nothing', true)).toBeUndefined();
  });
});

describe('dead letter queue', () => {
  const entry = (jobId: string, errorType: string) => ({
    jobId,
    jobData: { code: 'print(1)', input_data: { deep: [1, { x: 'y' }] }, job_type: 'data', timeout: 5 },
    errorType,
    errorMessage: `boom ${jobId}`,
    retryCount: 2,
    clientIp: '10.1.2.3',
    correlationId: `corr-${jobId}`,
  });

  it('insertDlq stores every field and returns the entry', async () => {
    const e = await insertDlq(db.kysely, entry('j1', 'internal_error'));
    expect(e).toMatchObject({
      job_id: 'j1',
      job_data: { code: 'print(1)', input_data: { deep: [1, { x: 'y' }] }, job_type: 'data', timeout: 5 },
      error_type: 'internal_error',
      error_message: 'boom j1',
      retry_count: 2,
      client_ip: '10.1.2.3',
      correlation_id: 'corr-j1',
    });
    expect((await listDlq(db.kysely, { limit: 10, offset: 0 })).rows).toEqual([e]);
  });

  it('dlqStats counts all and per error type; nothing when empty', async () => {
    expect(await dlqStats(db.kysely)).toEqual({ total: 0, by_error_type: {} });
    for (const [id, t] of [['a', 'x'], ['b', 'y'], ['c', 'x'], ['d', 'x']] as const) await insertDlq(db.kysely, entry(id, t));
    expect(await dlqStats(db.kysely)).toEqual({ total: 4, by_error_type: { x: 3, y: 1 } });
  });

  it('listDlq filters by error type, newest first', async () => {
    for (const [id, t] of [['a', 'x'], ['b', 'y'], ['c', 'x']] as const) await insertDlq(db.kysely, entry(id, t));
    expect((await listDlq(db.kysely, { errorType: 'x', limit: 10, offset: 0 })).rows.map((r) => r.job_id)).toEqual(['c', 'a']);
    expect((await listDlq(db.kysely, { errorType: 'z', limit: 10, offset: 0 })).rows).toEqual([]);
  });

  it('deleteDlq removes one entry and says so; false for one that is not there', async () => {
    const a = await insertDlq(db.kysely, entry('a', 'x'));
    const b = await insertDlq(db.kysely, entry('b', 'x'));
    expect(await deleteDlq(db.kysely, Number(a.id))).toBe(true);
    expect(await deleteDlq(db.kysely, Number(a.id))).toBe(false);
    expect((await listDlq(db.kysely, { limit: 10, offset: 0 })).rows.map((r) => r.job_id)).toEqual([b.job_id]);
  });
});

describe('job-type builds', () => {
  const at = (ms: number) => new Date(T0 + ms);
  const build = (id: string, extra: Partial<NewBuild> = {}): NewBuild => ({
    id,
    jobType: 'data',
    inputKey: 'inputs-1',
    versionTag: 'v1',
    requirements: ['numpy==2.0.0'],
    pythonVersion: '3.12',
    owner: 'replica-a',
    now: at(0),
    ...extra,
  });

  it('insertBuilding takes the lease of an input set once: a second build of the same inputs gets null', async () => {
    const first = await insertBuilding(db.kysely, build('b1'));
    expect(first).toMatchObject({
      id: 'b1',
      job_type: 'data',
      input_key: 'inputs-1',
      status: 'building',
      version_tag: 'v1',
      requirements: ['numpy==2.0.0'],
      python_version: '3.12',
      phase: 'queued',
      owner: 'replica-a',
      digest: null,
      finished_at: null,
    });
    expect(new Date(first!.heartbeat_at).getTime()).toBe(T0);
    expect(new Date(first!.created_at).getTime()).toBe(T0);

    expect(await insertBuilding(db.kysely, build('b2', { owner: 'replica-b' }))).toBeNull();
    // Other inputs, or another job type, are other leases.
    expect((await insertBuilding(db.kysely, build('b3', { inputKey: 'inputs-2' })))?.id).toBe('b3');
    expect((await insertBuilding(db.kysely, build('b4', { jobType: 'http' })))?.id).toBe('b4');
    expect((await buildingOf(db.kysely, 'data', 'inputs-1'))?.id).toBe('b1');
    expect(await buildingOf(db.kysely, 'data', 'inputs-9')).toBeUndefined();
  });

  it('the lease is free again once the build has finished, and only its owner can report or finish it', async () => {
    await insertBuilding(db.kysely, build('b1'));
    expect(await updateBuildPhase(db.kysely, 'b1', 'replica-b', 'installing', at(5))).toBe(false);
    expect(await updateBuildPhase(db.kysely, 'b1', 'replica-a', 'installing', at(5))).toBe(true);
    const mid = await getBuild(db.kysely, 'data', 'b1');
    expect([mid?.phase, new Date(mid!.heartbeat_at).getTime()]).toEqual(['installing', T0 + 5]);

    expect(await finishBuild(db.kysely, 'b1', 'replica-b', { status: 'failed', error: 'x', now: at(9), durationMs: 9 })).toBeUndefined();
    const done = await finishBuild(db.kysely, 'b1', 'replica-a', { status: 'built', digest: 'sha256:d', imageRef: 'reg/data@sha256:d', lock: [{ name: 'numpy', version: '2.0.0', sha256: null }], now: at(10), durationMs: 10 });

    expect(done).toMatchObject({ status: 'built', phase: 'built', digest: 'sha256:d', image_ref: 'reg/data@sha256:d', lock: [{ name: 'numpy', version: '2.0.0', sha256: null }], duration_ms: 10, error: null });
    expect([new Date(done!.finished_at!).getTime(), new Date(done!.heartbeat_at).getTime()]).toEqual([T0 + 10, T0 + 10]);
    // Finished: no more progress, no second finish; the inputs can be built again.
    expect(await updateBuildPhase(db.kysely, 'b1', 'replica-a', 'installing', at(11))).toBe(false);
    expect(await finishBuild(db.kysely, 'b1', 'replica-a', { status: 'failed', error: 'late', now: at(12), durationMs: 12 })).toBeUndefined();
    expect(await buildingOf(db.kysely, 'data', 'inputs-1')).toBeUndefined();
    expect((await insertBuilding(db.kysely, build('b2')))?.id).toBe('b2');
  });

  it('finishBuild as failed keeps the builder’s message', async () => {
    await insertBuilding(db.kysely, build('f1'));
    const failed = await finishBuild(db.kysely, 'f1', 'replica-a', { status: 'failed', error: 'pip: no matching distribution', now: at(7), durationMs: 7 });
    expect(failed).toMatchObject({ status: 'failed', phase: 'failed', error: 'pip: no matching distribution', digest: null, image_ref: null, lock: null, duration_ms: 7 });
    expect(new Date(failed!.finished_at!).getTime()).toBe(T0 + 7);
  });

  it('getBuild needs the job type too; listBuilds is one job type’s, newest first, up to the limit', async () => {
    for (const [id, jobType, ms] of [['l1', 'data', 1], ['l3', 'data', 3], ['l2', 'data', 2], ['lx', 'http', 4], ['l2b', 'data', 2]] as const) {
      await db.kysely
        .insertInto('job_type_builds')
        .values({ id, job_type: jobType, input_key: id, status: 'failed', requirements: '[]', python_version: '3.12', phase: 'failed', owner: 'o', heartbeat_at: at(ms), created_at: at(ms) })
        .execute();
    }
    expect((await getBuild(db.kysely, 'data', 'l1'))?.id).toBe('l1');
    expect(await getBuild(db.kysely, 'http', 'l1')).toBeUndefined();
    expect((await listBuilds(db.kysely, 'data', 10)).map((b) => b.id)).toEqual(['l3', 'l2b', 'l2', 'l1']);
    expect((await listBuilds(db.kysely, 'data', 2)).map((b) => b.id)).toEqual(['l3', 'l2b']);
  });

  it('builtBuilds: only built ones, oldest finish first (ties by id)', async () => {
    for (const [id, ms] of [['c', 30], ['a', 10], ['b', 30], ['x', 5]] as const) {
      await insertBuilding(db.kysely, build(id, { inputKey: id }));
      if (id === 'x') await finishBuild(db.kysely, id, 'replica-a', { status: 'failed', error: 'e', now: at(ms), durationMs: 1 });
      else await finishBuild(db.kysely, id, 'replica-a', { status: 'built', digest: `d-${id}`, imageRef: `r-${id}`, lock: [], now: at(ms), durationMs: 1 });
    }
    await insertBuilding(db.kysely, build('still-building', { inputKey: 'y' }));
    expect((await builtBuilds(db.kysely)).map((b) => b.id)).toEqual(['a', 'b', 'c']);
  });

  it('expireStaleBuild fails a building row whose lease is older than the bound, and nothing else', async () => {
    await insertBuilding(db.kysely, build('stale', { now: at(0) }));
    await insertBuilding(db.kysely, build('fresh', { inputKey: 'other', now: at(100) }));

    expect(await expireStaleBuild(db.kysely, 'fresh', at(100), at(200))).toBe(false); // heartbeat exactly at the bound: not stale
    expect(await expireStaleBuild(db.kysely, 'stale', at(100), at(200))).toBe(true);
    expect(await expireStaleBuild(db.kysely, 'stale', at(100), at(300))).toBe(false); // already failed

    expect(await getBuild(db.kysely, 'data', 'stale')).toMatchObject({ status: 'failed', phase: 'failed', error: 'the replica building it stopped (lease expired)' });
    expect(new Date((await getBuild(db.kysely, 'data', 'stale'))!.finished_at!).getTime()).toBe(T0 + 200);
    expect((await getBuild(db.kysely, 'data', 'fresh'))?.status).toBe('building');
  });
});
