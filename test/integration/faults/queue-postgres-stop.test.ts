/**
 * 50 async jobs through a PostgreSQL outage of 10 s (issue 22, "What must hold"): a private server
 * (never the shared one) is stopped while the queue is being served and started again. Every job ends
 * once (user code started exactly once per job, counted at the runtime) and correctly (succeeded, its
 * own output); none fails for the outage.
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Runtime } from '../../../src/runtime/runtime.ts';
import { appClient, countingStarts, settledBatch, submitBatch, untilSucceeded, wrongSuccess, type BatchClient } from '../../support/job-batch.ts';
import { privatePgUnavailable, startPrivatePg, type PrivatePg } from '../../support/private-pg.ts';
import { startTestService, type TestService } from '../../support/service.ts';

const why = privatePgUnavailable();
if (why) console.warn(`skipping the 50-job PostgreSQL outage test: ${why}`);

describe.skipIf(why !== null)('50 queued jobs, PostgreSQL stopped for 10 s', () => {
  let server: PrivatePg;
  let svc: TestService;
  let client: BatchClient;
  let workspace: string;
  let starts: Map<string, number>;

  beforeAll(async () => {
    server = await startPrivatePg();
    workspace = mkdtempSync(path.join(tmpdir(), 'sandpod-ws-'));
    chmodSync(workspace, 0o755);
    svc = await startTestService(
      { max_workers: 3, max_queue_size: 1000 },
      {
        runtime: async (real) => {
          const c = countingStarts(await real());
          starts = c.starts;
          return c.runtime as Runtime;
        },
      },
      { kind: 'postgres', url: server.url, workspace, drop: async () => {} },
    );
    client = appClient(svc);
  }, 120_000);

  afterAll(async () => {
    await svc?.close().catch(() => {});
    server?.destroy();
    if (workspace) rmSync(workspace, { recursive: true, force: true });
  });

  it('every job succeeds once, with its own output', async () => {
    const ids = await submitBatch(client, 50);
    await untilSucceeded(client, ids, 8);
    server.stop();
    const t0 = Date.now();
    // Runs in flight end during the outage; their results wait in the process.
    await new Promise((r) => setTimeout(r, 10_000));
    server.start();
    const rows = await settledBatch(client, ids);
    expect(rows.map((r, i) => wrongSuccess(i, r)).filter(Boolean)).toEqual([]);
    expect(ids.filter((id) => starts.get(id) !== 1).map((id) => [id, starts.get(id) ?? 0])).toEqual([]);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(10_000);
  }, 120_000);
});
