/**
 * The artifact limit (issue 22): a real run on each real engine writes more files to /output than a
 * record lists; the record says how many there were and that the list is incomplete. A run under the
 * limit is not flagged.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { MAX_ARTIFACT_ENTRIES } from '../../../src/runtime/run-output.ts';
import { describeEachEngine } from '../../support/engines.ts';
import { startTestService, type TestService } from '../../support/service.ts';

/** A program writing `n` small files `f0000.txt`… and a result. */
const writes = (n: number) =>
  `import json\nfor i in range(${n}):\n    open(f"/output/f{i:04d}.txt", "w").write(str(i))\njson.dump({"n": ${n}}, open("/output/result.json", "w"))`;

describeEachEngine('artifact limit', (engine) => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService({ sandbox_engine: engine, max_timeout: 60, default_timeout: 60 });
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  async function runFull(code: string): Promise<Record<string, any>> {
    const res = await svc.post('/execute', { code });
    const body = (await res.json()) as Record<string, any>;
    expect(body).toMatchObject({ success: true });
    return (await (await svc.get(`/jobs/${body.execution_id}/result?view=full`)).json()) as Record<string, any>;
  }

  it(`a run writing 1,500 files: ${MAX_ARTIFACT_ENTRIES} listed, 1,500 counted, flagged; its result kept`, async () => {
    const rec = await runFull(writes(1500));
    expect(rec).toMatchObject({ status: 'succeeded', output: { n: 1500 }, artifacts_total: 1500, artifacts_truncated: true });
    expect(rec.artifacts).toHaveLength(MAX_ARTIFACT_ENTRIES);
    const last = `f${String(MAX_ARTIFACT_ENTRIES - 1).padStart(4, '0')}.txt`;
    expect(rec.artifacts.at(-1).name).toBe(last);
    const kept = await svc.get(`/jobs/${rec.execution_id}/artifacts/${last}`);
    expect(kept.status).toBe(200);
    expect(await kept.text()).toBe(String(MAX_ARTIFACT_ENTRIES - 1));
    expect((await svc.get(`/jobs/${rec.execution_id}/artifacts/f1499.txt`)).status).toBe(404);
  }, 120_000);

  it('a run under the limit: everything listed, not flagged', async () => {
    const rec = await runFull(writes(12));
    expect(rec).toMatchObject({ status: 'succeeded', artifacts_total: 12, artifacts_truncated: false });
    expect(rec.artifacts).toHaveLength(12);
  }, 60_000);
});
