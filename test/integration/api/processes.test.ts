/**
 * Real service processes on one PostgreSQL: kill -9 and restart, graceful SIGTERM, two processes
 * sharing one queue without running a job twice. PostgreSQL only: PGlite is one process's database.
 */
import { closeSync, openSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { describe, expect, it, vi } from 'vitest';
import { freshDatabase, testDbKind } from '../../support/db.ts';
import { startServiceProcess } from '../../support/process.ts';
import { useServiceProcesses } from '../../support/service-processes.ts';

type J = Record<string, any>;
const kind = await testDbKind();

async function post(base: string, p: string, body: unknown): Promise<J> {
  const res = await fetch(base + p, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return (await res.json()) as J;
}
async function get(base: string, p: string): Promise<J> {
  return (await (await fetch(base + p)).json()) as J;
}
async function until<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 60_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (ok(v)) return v;
    if (Date.now() > end) throw new Error(`condition not met: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe.skipIf(kind !== 'postgres')('service processes on one PostgreSQL', () => {
  const services = useServiceProcesses();

  it('kill -9 mid-run, restart: queued jobs run, the running one is settled (failed, DLQ)', async () => {
    const a = await services.start('a', { max_workers: 1 });
    const long = await post(a.url, '/execute/async', { code: 'import time\nprint("in", flush=True)\ntime.sleep(60)', timeout: 90 });
    const queued = [await post(a.url, '/execute/async', { code: 'print("q1")' }), await post(a.url, '/execute/async', { code: 'print("q2")' })];
    await until(() => get(a.url, `/jobs/${long.job_id}`), (s) => s.status === 'running');
    // let user code start (the phase hint reaches the record)
    await new Promise((r) => setTimeout(r, 1500));
    a.kill('SIGKILL');
    await a.exited;

    const b = await services.start('b', { max_workers: 1 });
    for (const q of queued) {
      const r = await get(b.url, `/jobs/${q.job_id}/result?wait=true&timeout=60`);
      expect(r.status).toBe('succeeded');
    }
    const settled = await until(() => get(b.url, `/jobs/${long.job_id}/result`), (r) => r.status === 'failed');
    expect(settled.error.type).toBe('internal_error');
    const dlq = await get(b.url, '/dlq');
    expect(dlq.items.some((e: J) => e.job_id === long.job_id)).toBe(true);
    b.kill('SIGTERM');
    await b.exited;
  });

  it('SIGTERM lets the running job finish and leaves queued work queued; the next process runs it', async () => {
    const a = await services.start('c', { max_workers: 1, shutdown_grace_seconds: 20 });
    const running = await post(a.url, '/execute/async', { code: 'import time\ntime.sleep(2)\nprint("finished")' });
    await until(() => get(a.url, `/jobs/${running.job_id}`), (s) => s.status === 'running');
    const waiting = await post(a.url, '/execute/async', { code: 'print("later")' });
    a.kill('SIGTERM');
    expect(await a.exited).toBe(0);
    const b = await services.start('d', { max_workers: 1 });
    const r1 = await get(b.url, `/jobs/${running.job_id}/result`);
    expect(r1).toMatchObject({ status: 'succeeded', stdout: 'finished\n' });
    const r2 = await get(b.url, `/jobs/${waiting.job_id}/result?wait=true&timeout=60`);
    expect(r2).toMatchObject({ status: 'succeeded', stdout: 'later\n' });
    b.kill('SIGTERM');
    await b.exited;
  });

  it('two processes share the queue and never run a job twice', async () => {
    const cfg = { max_workers: 2, max_queue_size: 1000 };
    // One workspace per process (a workspace belongs to one live process; the database is shared).
    const [a, b] = await Promise.all([
      services.start('e', cfg, { ownWorkspace: true }),
      services.start('f', cfg, { ownWorkspace: true }),
    ]);
    const ids: string[] = [];
    for (let i = 0; i < 30; i++) ids.push((await post(i % 2 ? a.url : b.url, '/execute/async', { code: `print(${i})` })).job_id);
    for (const id of ids) expect((await get(a.url, `/jobs/${id}/result?wait=true&timeout=60`)).status).toBe('succeeded');
    const count = async (url: string) => {
      const text = await (await fetch(`${url}/metrics`)).text();
      return [...text.matchAll(/^sandpod_runs_total\{[^}]*mode="async"[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);
    };
    // The holder counts a run just after its record is settled, so a waiter can see the result a moment
    // before the count moves: poll. A job run twice would push the sum past 30 and never match.
    await vi.waitFor(async () => expect((await count(a.url)) + (await count(b.url))).toBe(30), { timeout: 10_000, interval: 100 });
    const full = await Promise.all(ids.map((id) => get(a.url, `/executions/${id}?view=full`)));
    expect(full.every((r) => r.status === 'succeeded')).toBe(true);
    const client = new pg.Client({ connectionString: services.db().url! });
    await client.connect();
    const r = await client.query<{ attempts: number }>('SELECT attempts FROM executions WHERE id = ANY($1)', [ids]);
    await client.end();
    expect(r.rows.map((x) => x.attempts)).toEqual(Array(30).fill(1));
  });
});

describe.skipIf(kind !== 'postgres')('one workspace, one live process', () => {
  it('a second process on a workspace in use refuses to start and says why', async () => {
    const db = await freshDatabase();
    const a = await startServiceProcess({ databaseUrl: db.url!, workspace: db.workspace, name: 'own-a' });
    try {
      const err = await startServiceProcess({ databaseUrl: db.url!, workspace: db.workspace, name: 'own-b' }).catch((e: Error) => e);
      expect(err).toBeInstanceOf(Error);
      expect((err as Error).message).toContain('in use by another sandpod process');
      // the first process is unharmed
      const r = await post(a.url, '/execute', { code: 'print("still here")' });
      expect(r.stdout).toBe('still here\n');
    } finally {
      a.kill('SIGTERM');
      await a.exited;
      await db.drop();
    }
  });
});

describe.skipIf(kind !== 'postgres')('fds the service inherited', () => {
  it('a descriptor the service was started with (not close-on-exec) never reaches a sandbox', async () => {
    const db = await freshDatabase();
    const marker = path.join(db.workspace, 'leak-marker');
    writeFileSync(marker, 'the harness pipe');
    const fd = openSync(marker, 'r');
    const a = await startServiceProcess({ databaseUrl: db.url!, workspace: db.workspace, name: 'fds', config: { sandbox_engine: 'bubblewrap' }, inheritFds: { 40: fd, 41: fd } });
    closeSync(fd);
    try {
      const code = 'import os\nfor n in os.listdir("/proc/self/fd"):\n    try:\n        print(n, os.readlink("/proc/self/fd/" + n))\n    except OSError:\n        pass\n';
      const r = await post(a.url, '/execute', { code });
      expect(r.success).toBe(true);
      const links = [...String(r.stdout).matchAll(/^(\d+) (.*)$/gm)].map((x) => [Number(x[1]), x[2]]);
      expect(links.map(([n]) => n)).toEqual(expect.arrayContaining([0, 1, 2]));
      expect(links.filter(([n, l]) => n === 40 || n === 41 || String(l).includes('leak-marker'))).toEqual([]);
    } finally {
      a.kill('SIGTERM');
      await a.exited;
      await db.drop();
    }
  });
});
