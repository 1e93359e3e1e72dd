/**
 * Files for one-shot runs (issue 19): `input_files` and `input_artifacts` appear read-only under
 * /input/files/ on a real sandbox, cold and warm, on each real engine; the record lists them with
 * size and sha256; a job chains from another job's artifact; rerun and fork keep the files; bad names
 * (traversal, absolute paths, reserved names) are 400 and unknown artifacts 404.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { describeEachEngine } from '../../support/engines.ts';
import { b64, expectInputFilesSeen, INPUT_FILES_REQUEST, sha } from '../../support/input-files.ts';
import { startTestService, type TestService } from '../../support/service.ts';

/** Waits (generously) until the default job type has a ready warm sandbox. */
async function warmReady(svc: TestService): Promise<void> {
  for (let i = 0; i < 600; i++) {
    if ((svc.runtime.warmPoolStats?.().find((p) => p.job_type === 'default')?.ready ?? 0) >= 1) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('no warm sandbox became ready in 60 s');
}

describeEachEngine('input files on a real sandbox', (engine) => {
  for (const mode of ['cold', 'warm'] as const) {
    describe(mode, () => {
      let svc: TestService;
      beforeAll(async () => {
        svc = await startTestService({ sandbox_engine: engine, ...(mode === 'cold' ? { warm_pool: { sizes: {} } } : { warm_pool: { sizes: { default: 1 } } }) });
        if (mode === 'warm') await warmReady(svc);
      }, 120_000);
      afterAll(async () => {
        await svc?.close();
      });

      it('the files are there, read-only, with their exact bytes', async () => {
        const res = await svc.post('/execute', INPUT_FILES_REQUEST);
        const body = (await res.json()) as Record<string, any>;
        expect(res.status, JSON.stringify(body)).toBe(200);
        const rec = (await (await svc.get(`/jobs/${body.execution_id}?view=full`)).json()) as Record<string, any>;
        const dl = await svc.get(`/jobs/${body.execution_id}/artifacts/bin.dat`);
        expectInputFilesSeen(body, rec, Buffer.from(await dl.arrayBuffer()));
        if (mode === 'warm') expect(svc.runtime.warmPoolStats?.().find((p) => p.job_type === 'default')?.hits).toBeGreaterThanOrEqual(1);
      }, 90_000);

      it('a run without files has no /input/files', async () => {
        const res = await svc.post('/execute', { code: 'import os, json\njson.dump(os.path.exists("/input/files"), open("/output/result.json", "w"))' });
        expect(((await res.json()) as any).output).toBe(false);
      }, 60_000);
    });
  }
});

describe('input files: chaining, rerun, fork, refusals', () => {
  let svc: TestService;
  beforeAll(async () => {
    svc = await startTestService({ warm_pool: { sizes: {} }, max_artifact_bytes: 64 * 1024 });
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  async function waitFull(id: string): Promise<Record<string, any>> {
    const res = await svc.get(`/jobs/${id}/result?wait=true&timeout=60&view=full`);
    expect(res.status).toBe(200);
    return (await res.json()) as Record<string, any>;
  }

  async function submit(body: Record<string, unknown>): Promise<string> {
    const res = await svc.post('/execute/async', body);
    const j = (await res.json()) as Record<string, any>;
    expect(res.status, JSON.stringify(j)).toBe(202);
    return j.job_id as string;
  }

  it('a job reads another job\'s artifact by reference; rerun and fork keep it', async () => {
    const producer = await submit({ code: 'open("/output/out.csv", "w").write("n\\n1\\n2\\n3\\n")' });
    const p = await waitFull(producer);
    expect(p.status).toBe('succeeded');
    const CONSUME = 'import json\nrows = open("/input/files/in.csv").read().split()\njson.dump({"rows": rows, "extra": open("/input/files/extra.txt").read()}, open("/output/result.json", "w"))';
    const consumer = await submit({ code: CONSUME, input_artifacts: [{ job_id: producer, name: 'out.csv', as: 'in.csv' }], input_files: { 'extra.txt': b64('more') } });
    const c = await waitFull(consumer);
    expect(c.status, c.stderr).toBe('succeeded');
    expect(c.output).toEqual({ rows: ['n', '1', '2', '3'], extra: 'more' });
    const inCsv = c.input_artifacts.find((a: any) => a.name === 'in.csv');
    expect(inCsv).toMatchObject({ size_bytes: 8, sha256: sha('n\n1\n2\n3\n'), path: '/input/files/in.csv', source: { job_id: producer, name: 'out.csv' } });

    const rerun = (await (await svc.post(`/jobs/${consumer}/rerun`)).json()) as Record<string, any>;
    const r = await waitFull(rerun.job_id);
    expect(r).toMatchObject({ status: 'succeeded', output: c.output, parent_execution_id: consumer, relationship: 'rerun' });
    expect(r.input_artifacts).toEqual(c.input_artifacts);

    const fork = (await (await svc.post(`/jobs/${consumer}/fork`, { code: 'import json\njson.dump(open("/input/files/in.csv").read(), open("/output/result.json", "w"))' })).json()) as Record<string, any>;
    const f = await waitFull(fork.job_id);
    expect(f).toMatchObject({ status: 'succeeded', output: 'n\n1\n2\n3\n', relationship: 'fork' });
  }, 180_000);

  it('idempotency: the same key with other files is a 409', async () => {
    const first = await svc.post('/execute/async', { code: 'print(1)', idempotency_key: 'files-key', input_files: { 'a.txt': b64('1') } });
    expect(first.status).toBe(202);
    const same = await svc.post('/execute/async', { code: 'print(1)', idempotency_key: 'files-key', input_files: { 'a.txt': b64('1') } });
    expect(same.status).toBe(200);
    const other = await svc.post('/execute/async', { code: 'print(1)', idempotency_key: 'files-key', input_files: { 'a.txt': b64('2') } });
    expect(other.status).toBe(409);
  }, 60_000);

  const BAD_NAMES = ['../x', '../../etc/passwd', '/etc/passwd', 'a/b', 'a\\b', '..', '.', '..hidden', '', 'a\u0000b', 'a\nb', '_code.py', '_input.json', 'x'.repeat(256)];
  for (const endpoint of ['/execute', '/execute/async']) {
    it(`${endpoint}: traversal and reserved names are 400, naming the file`, async () => {
      for (const name of BAD_NAMES) {
        const res = await svc.post(endpoint, { code: 'print(1)', input_files: { [name]: b64('x') } });
        const body = (await res.json()) as Record<string, any>;
        expect(res.status, `${JSON.stringify(name)}: ${JSON.stringify(body)}`).toBe(400);
        expect(body.detail).toContain('input_files');
        const viaAs = await svc.post(endpoint, { code: 'print(1)', input_artifacts: [{ job_id: 'x', name: 'y', as: name }] });
        expect(viaAs.status, `as ${JSON.stringify(name)}`).toBe(400);
      }
    }, 60_000);
  }

  it('bad content, duplicates, sizes and unknown artifacts are refused with clear messages', async () => {
    const cases: [Record<string, unknown>, number, string][] = [
      [{ input_files: { 'a.txt': 'not base64!' } }, 400, 'not base64'],
      [{ input_files: { 'a.txt': 5 } }, 400, 'base64'],
      [{ input_files: ['a'] }, 400, 'input_files'],
      [{ input_files: { 'big.bin': b64(Buffer.alloc(64 * 1024 + 1)) } }, 400, 'max_artifact_bytes'],
      [{ input_files: { 'a.txt': b64('1') }, input_artifacts: [{ job_id: 'nope', name: 'a.txt' }] }, 404, "job 'nope' has no artifact"],
      [{ input_artifacts: [{ job_id: 'nope', name: '../../etc/passwd' }] }, 400, 'path separator'],
      [{ input_artifacts: [{ job_id: 'nope', name: 'etc/passwd', as: 'p' }] }, 404, 'has no artifact'],
      [{ input_artifacts: [{ job_id: 'x' }] }, 400, 'input_artifacts'],
    ];
    for (const [extra, status, text] of cases) {
      const res = await svc.post('/execute', { code: 'print(1)', ...extra });
      const body = (await res.json()) as Record<string, any>;
      expect(res.status, JSON.stringify(extra).slice(0, 100)).toBe(status);
      expect(body.detail).toContain(text);
    }
    // Two files of one name: one inline, one by reference.
    const producer = (await (await svc.post('/execute', { code: 'open("/output/a.txt", "w").write("a")' })).json()) as Record<string, any>;
    const dup = await svc.post('/execute', { code: 'print(1)', input_files: { 'a.txt': b64('1') }, input_artifacts: [{ job_id: producer.execution_id, name: 'a.txt' }] });
    expect(dup.status).toBe(400);
    expect(((await dup.json()) as any).detail).toContain('two input files are named "a.txt"');
  }, 60_000);
});
