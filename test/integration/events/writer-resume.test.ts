/**
 * The run event writer picking up a run another process held (adoption after a restart): the
 * runtime delivers the output from its start again, and what is stored already is not stored twice.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../../src/clock.ts';
import { RunEventWriter } from '../../../src/executions/events.ts';
import { silentLogger } from '../../../src/logger.ts';
import { insertExecution } from '../../../src/store/executions.repository.ts';
import { storedOutput } from '../../../src/store/events.repository.ts';
import type { Db } from '../../../src/store/database.ts';
import { connectionPair, freshDatabase, type TestDatabase } from '../../support/db.ts';
import { orphanRow } from '../../support/rows.ts';

let database: TestDatabase;
let db: Db;
let close: () => Promise<void>;
beforeAll(async () => {
  database = await freshDatabase();
  const pair = await connectionPair(database);
  db = pair.writer;
  close = pair.close;
});
afterAll(async () => {
  await close?.();
  await database?.drop();
});

const enc = (s: string) => new TextEncoder().encode(s);
const writer = (id: string, maxBytes = 1000) => new RunEventWriter({ db, executionId: id, maxBytes, clock: systemClock, logger: silentLogger, flushMs: 1 });

/** A running record held by this test (the run whose events are written). */
async function run(id: string): Promise<void> {
  await insertExecution(db.kysely, orphanRow(id, 'execution', 'print(1)', 'this-test'));
}

describe('RunEventWriter.resume', () => {
  it('skips the bytes stored before, mid-chunk, per stream; the rest is stored once', async () => {
    await run('r1');
    const first = writer('r1');
    first.output('stdout', enc('héllo '));
    first.output('stderr', enc('warn\n'));
    await first.close();
    // The new holder: the log is followed from the start again.
    const second = writer('r1');
    await second.resume();
    second.output('stdout', enc('hé'));
    second.output('stdout', enc('llo wor'));
    second.output('stdout', enc('ld\n'));
    second.output('stderr', enc('warn\nmore\n'));
    await second.close();
    const stored = await storedOutput(db.kysely, 'r1');
    expect(stored.texts.stdout.join('')).toBe('héllo world\n');
    expect(stored.texts.stderr.join('')).toBe('warn\nmore\n');
  });

  it('the cap counts what was stored before; a stream already cut stays cut', async () => {
    await run('r2');
    const first = writer('r2', 8);
    first.output('stdout', enc('12345'));
    first.output('stderr', enc('0123456789'));
    await first.close();
    const second = writer('r2', 8);
    await second.resume();
    second.output('stdout', enc('123456789'));
    second.output('stderr', enc('0123456789 again'));
    await second.close();
    const stored = await storedOutput(db.kysely, 'r2');
    expect(stored.texts.stdout.join('')).toBe('12345678');
    expect(stored.texts.stderr.join('')).toBe('01234567');
    expect(stored.truncated.sort()).toEqual(['stderr', 'stdout']);
  });

  it('a run with nothing stored resumes from the first byte', async () => {
    await run('r3');
    const w = writer('r3');
    await w.resume();
    w.output('stdout', enc('all of it'));
    await w.close();
    expect((await storedOutput(db.kysely, 'r3')).texts.stdout.join('')).toBe('all of it');
  });
});
