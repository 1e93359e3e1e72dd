/**
 * Fault: the workspace out of space (issue #9 §6). `SVC_WORKSPACE` is a small tmpfs with the runs
 * directory on it too, as on a host without cgroups (test/support/small-workspace.ts says why).
 *
 * Decided: a sync run the service cannot prepare or collect because the disk is full fails with
 * `internal_error` (message names ENOSPC), is retried once, counts against the breaker and lands in
 * the DLQ — like any other failure of the machinery; a queued job that fails so before its code
 * started goes back to the queue instead and runs once space is freed (issue 22 item 4); a program whose own write hits ENOSPC ends as
 * its exception says (`os_error`; `runtime_error` when even the runner's report no longer fits). The service keeps answering, and runs work again once space is
 * freed (after the breaker's recovery, if it opened).
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, rmSync, statfsSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, type TestDatabase } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { mountSmallWorkspace, runsOnWorkspace, smallWorkspaceUnavailable, unmountSmallWorkspace } from '../../support/small-workspace.ts';

type J = Record<string, any>;

// PGlite keeps its data under the workspace: filling the workspace would be a database fault too.
const why = await smallWorkspaceUnavailable();
if (why) console.warn(`skipping the full-workspace fault test: ${why}`);

describe.skipIf(why !== null)('workspace out of space', () => {
  let db: TestDatabase;
  let ws: string;
  let runsDir: string;
  let svc: TestService;
  const unexpected5xx: string[] = [];
  let faults = 0;
  let asyncJob = '';

  async function call(method: 'GET' | 'POST', p: string, body?: unknown): Promise<{ status: number; body: J }> {
    const res = method === 'POST' ? await svc.post(p, body) : await svc.get(p);
    const parsed = (await res.json()) as J;
    // Documented 503s: the breaker open (service_unavailable) and /health while degraded.
    const documented = res.status === 503 && (parsed.code === 'service_unavailable' || (p === '/health' && parsed.status === 'degraded'));
    if (res.status >= 500 && !documented) unexpected5xx.push(`${method} ${p} → ${res.status} ${JSON.stringify(parsed)}`);
    return { status: res.status, body: parsed };
  }

  function fill(leaveBytes: number): void {
    const st = statfsSync(ws);
    const free = st.bavail * st.bsize;
    const mb = Math.max(0, Math.floor((free - leaveBytes) / 2 ** 20));
    spawnSync('dd', ['if=/dev/zero', `of=${ws}/filler-${Date.now()}`, 'bs=1M', `count=${leaveBytes === 0 ? 1_000_000 : mb}`], { stdio: 'ignore' });
  }
  function freeSpace(): void {
    for (const f of readdirSync(ws)) if (f.startsWith('filler-')) rmSync(path.join(ws, f));
  }

  beforeAll(async () => {
    db = await freshDatabase();
    ws = mountSmallWorkspace('full');
    svc = await startTestService(
      { max_workers: 2, breaker: { failure_threshold: 5, recovery_timeout_ms: 1000, success_threshold: 2 } },
      {},
      { ...db, workspace: ws },
    );
    runsDir = runsOnWorkspace(ws);
  }, 120_000);

  afterAll(async () => {
    await svc?.close().catch(() => {});
    unmountSmallWorkspace(ws, runsDir);
    await db?.drop();
    console.info(`workspace faults: ${faults} injected, ${unexpected5xx.length} unexpected 5xx`);
  });

  it("a program's own write hitting ENOSPC: the program's failure, not the service's", async () => {
    fill(4 * 2 ** 20);
    faults++;
    const r = await call('POST', '/execute', { code: 'open("/output/big.bin", "wb").write(b"x" * 20_000_000)' });
    expect(r.status).toBe(200);
    // The program decides: it failed (exit 1) with its traceback. The error type is `os_error` when the
    // runner's report fits on the disk; here the program took the last bytes, the report cannot be
    // written and the type falls back to `runtime_error` (the exit code, traceback and status stay).
    expect(r.body, JSON.stringify(r.body)).toMatchObject({ success: false, exit_code: 1, error: { type: expect.stringMatching(/^(os_error|runtime_error)$/) } });
    expect(r.body.stderr).toMatch(/OSError: \[Errno 28\] No space left on device/);
  }, 60_000);

  it('a full disk under the run directory: internal_error naming ENOSPC (sync and async), the service keeps serving', async () => {
    fill(0);
    faults++;
    const sync = await call('POST', '/execute', { code: 'print(1)' });
    expect(sync.status).toBe(200);
    expect(sync.body).toMatchObject({ success: false, exit_code: null, error: { type: 'internal_error', message: expect.stringMatching(/ENOSPC/) } });

    // A queued job is not failed for the full disk (issue 22 item 4): it goes back to the queue with a
    // backoff, and runs once space is freed (the next test).
    const sub = await call('POST', '/execute/async', { code: 'print(2)' });
    expect(sub.status).toBe(202);
    asyncJob = sub.body.job_id;
    const res = await call('GET', `/jobs/${asyncJob}/result?wait=true&timeout=4`);
    expect(res.status).toBe(408);
    expect(['pending', 'queued', 'running']).toContain(res.body.status);

    // Still serving: health answers with a body, history reads work, the DLQ holds the failed run.
    const health = await call('GET', '/health');
    expect([200, 503]).toContain(health.status);
    expect(health.body.database).toMatchObject({ available: true });
    expect((await call('GET', '/executions?limit=5')).status).toBe(200);
    const dlq = await call('GET', '/dlq?error_type=internal_error');
    expect(dlq.body.items.map((e: J) => e.job_id)).toContain(sync.body.execution_id);
  }, 90_000);

  it('space freed: runs succeed again (after the breaker recovers) and the breaker closes', async () => {
    freeSpace();
    const deadline = Date.now() + 30_000;
    let last: J = {};
    for (;;) {
      last = (await call('POST', '/execute', { code: 'print("back")' })).body;
      if (last.success === true) break;
      if (Date.now() > deadline) throw new Error(`runs did not recover: ${JSON.stringify(last)}`);
      await new Promise((r) => setTimeout(r, 300));
    }
    expect(last).toMatchObject({ success: true, stdout: 'back\n' });
    expect((await call('POST', '/execute', { code: 'print(3)' })).body).toMatchObject({ success: true });
    expect((await call('GET', '/health')).body.circuit_breaker.state).toBe('closed');
    const queued = await call('GET', `/jobs/${asyncJob}/result?wait=true&timeout=60`);
    expect(queued.body).toMatchObject({ status: 'succeeded', stdout: '2\n' });
    expect(unexpected5xx).toEqual([]);
  }, 60_000);
});
