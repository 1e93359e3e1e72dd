/**
 * POST /jobs/{id}/cancel (SPEC §4.5) beyond the happy path: the 202 `cancelling` answer when the run
 * does not stop within the wait, the 200 with the real status when the run finished first, and what a
 * cancel frees — the worker slot (the next job runs) and the sandbox (no process or cgroup left behind).
 *
 * The first two use a record held by another (live, heartbeating) process that this service cannot
 * kill: the test plays that holder, which makes both outcomes deterministic.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DONE_CHANNEL } from '../../../src/queue/channels.ts';
import { getExecution, insertExecution, settleRunning } from '../../../src/store/executions.repository.ts';
import { instanceRoot } from '../../../src/runtime/local/workspace.ts';
import { newRow } from '../../support/rows.ts';
import { startTestService, type TestService } from '../../support/service.ts';

let svc: TestService;
beforeAll(async () => {
  svc = await startTestService({ max_workers: 1 });
});
afterAll(async () => {
  await svc?.close();
});

type J = Record<string, any>;
const OTHER_HOLDER = 'another-host/4242/feedface';

/** A running record held by {@link OTHER_HOLDER}, whose heartbeat the test keeps fresh. */
async function heldElsewhere(id: string): Promise<{ stop(): void }> {
  await insertExecution(
    svc.db.kysely,
    newRow(id, {
      status: 'running',
      code: 'import time; time.sleep(600)',
      timeout_s: 600,
      idempotency_key: null,
      parent_execution_id: null,
      started_at: new Date(),
      attempts: 1,
      claimed_by: OTHER_HOLDER,
      heartbeat_at: new Date(),
    }),
  );
  // A live holder: the service's sweep must not adopt the run.
  const timer = setInterval(() => {
    void svc.db.kysely.updateTable('executions').set({ heartbeat_at: new Date() }).where('id', '=', id).where('status', '=', 'running').execute();
  }, 200);
  return { stop: () => clearInterval(timer) };
}

async function until<T>(f: () => Promise<T | undefined | null | false>, ms = 15_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('cancel of a run held by a process that does not stop it', () => {
  it('answers 202 cancelling after the wait, with the request recorded for the holder', async () => {
    const id = 'cancel-202-0000-0000-000000000001';
    const holder = await heldElsewhere(id);
    try {
      const t0 = Date.now();
      const res = await svc.post(`/jobs/${id}/cancel`);
      expect(res.status).toBe(202);
      expect(await res.json()).toEqual({
        job_id: id,
        status: 'cancelling',
        previous_status: 'running',
        message: 'cancellation requested; the job will stop shortly',
      });
      // SPEC §4.5: the answer waits up to 10 s for the run to stop.
      expect(Date.now() - t0).toBeGreaterThanOrEqual(9_000);
      const row = await getExecution(svc.db.kysely, id);
      expect(row).toMatchObject({ status: 'running', cancel_requested: true, claimed_by: OTHER_HOLDER });
      const st = (await (await svc.get(`/jobs/${id}`)).json()) as J;
      expect(st.status).toBe('running');
    } finally {
      holder.stop();
    }
  }, 30_000);

  it('answers 200 with the real status when the run finished before the cancel took effect', async () => {
    const id = 'cancel-200-0000-0000-000000000002';
    const holder = await heldElsewhere(id);
    try {
      // The holder sees the request and, as it happens, its run has just succeeded.
      const settled = until(async () => {
        const row = await getExecution(svc.db.kysely, id);
        if (!row?.cancel_requested) return undefined;
        holder.stop();
        return settleRunning(svc.db.kysely, id, OTHER_HOLDER, { status: 'succeeded', exit_code: 0, ended_at: new Date(), duration_ms: 5, claimed_by: null }, DONE_CHANNEL);
      });
      const t0 = Date.now();
      const res = await svc.post(`/jobs/${id}/cancel`);
      expect(await settled).toMatchObject({ status: 'succeeded' });
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({
        job_id: id,
        status: 'succeeded',
        previous_status: 'running',
        message: "job finished with status 'succeeded' before the cancellation took effect",
      });
      expect(Date.now() - t0).toBeLessThan(9_000);
    } finally {
      holder.stop();
    }
  }, 30_000);
});

describe('what a cancel frees (max_workers 1)', () => {
  /** Pids of live processes whose command line contains `marker`. */
  function processesWith(marker: string): number[] {
    const pids: number[] = [];
    for (const p of readdirSync('/proc')) {
      if (!/^\d+$/.test(p)) continue;
      try {
        if (readFileSync(`/proc/${p}/cmdline`, 'latin1').includes(marker)) pids.push(Number(p));
      } catch {
        // gone meanwhile
      }
    }
    return pids;
  }

  /** The cgroup directories (v1 hierarchies or the unified one) that hold process `pid`. */
  function cgroupsOf(pid: number): string[] {
    return readFileSync(`/proc/${pid}/cgroup`, 'utf8')
      .split('\n')
      .filter((l) => l.includes('/sandpod/'))
      .map((l) => {
        const [, controllers, rel] = l.split(':') as [string, string, string];
        const dir = controllers === '' ? 'unified' : controllers.split(',').find((c) => ['memory', 'pids', 'cpu'].includes(c));
        return dir ? path.join('/sys/fs/cgroup', controllers === '' && !existsSync('/sys/fs/cgroup/unified') ? '' : dir, rel) : '';
      })
      .filter((d) => d !== '' && existsSync(d));
  }

  it('the next job runs in the freed slot, and the cancelled sandbox leaves nothing behind', async () => {
    const marker = `sandpod-cancel-marker-${process.pid}-${Date.now()}`;
    // The program leaves a child of its own behind (a shell with the marker on its command line).
    const code = `import subprocess, time\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 600; echo ${marker}'], start_new_session=True)\nprint('up', flush=True)\ntime.sleep(600)`;
    const s = (await (await svc.post('/execute/async', { code, timeout: 120 })).json()) as J;
    const [pid] = await until(async () => {
      const pids = processesWith(marker);
      return pids.length > 0 ? pids : undefined;
    });
    expect(((await (await svc.get(`/jobs/${s.job_id}`)).json()) as J).status).toBe('running');
    // The run's own cgroups (a warm sandbox waiting for the next job has others).
    const groups = cgroupsOf(pid!);
    const { instance } = instanceRoot(svc.config);
    if (process.getuid?.() === 0) expect(groups.length).toBeGreaterThan(0);
    for (const g of groups) expect(g).toContain(`/sandpod/${instance}/`);
    // The only slot is taken: a second job waits in the queue.
    const next = (await (await svc.post('/execute/async', { code: 'print("next")' })).json()) as J;
    await new Promise((r) => setTimeout(r, 500));
    expect(((await (await svc.get(`/jobs/${next.job_id}`)).json()) as J).status).toBe('queued');

    const res = await svc.post(`/jobs/${s.job_id}/cancel`);
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ status: 'cancelled', previous_status: 'running' });

    const r = (await (await svc.get(`/jobs/${next.job_id}/result?wait=true&timeout=30`)).json()) as J;
    expect(r).toMatchObject({ status: 'succeeded', stdout: 'next\n' });
    await until(async () => processesWith(marker).length === 0, 5_000).catch(() => undefined);
    expect(processesWith(marker)).toEqual([]);
    await until(async () => groups.every((g) => !existsSync(g)), 5_000).catch(() => undefined);
    expect(groups.filter((g) => existsSync(g))).toEqual([]);
  }, 60_000);
});
