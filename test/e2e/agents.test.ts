/**
 * Issue 19 on a real cluster, through the service's HTTP API: the real app in this process (its
 * Kubernetes runtime and JobType registry pointed at the cluster, PostgreSQL on this machine, bearer
 * tokens on), listening on 127.0.0.1, driven over HTTP as an agent drives it; under the gVisor
 * RuntimeClass with `SANDPOD_E2E_GVISOR=1`. test/e2e/sessions.test.ts drives the runtime directly
 * (pods, adoption, OOM, the escape probe); this file covers what only the whole service shows:
 *
 * - the first session of `default` is taken from the session pool (`warm: true` in its view, its pod
 *   a pooled `sps-p-` Job's); state across cells; a cell is an execution record;
 * - two sessions see neither each other's variables, files nor processes;
 * - the files API on every route against traversal and planted links (test/support/session-files.ts,
 *   the same checks as the local runtime's and the fake API server's), requests sent raw so that no
 *   client normalises a path first;
 * - kills that end a session `crashed`: a cell that ignores its interrupt, and a cell whose
 *   interpreter is killed;
 * - `input_files` and `input_artifacts` of a job the caller names, on one-shot runs: read-only under
 *   /input/files/, listed on the record with size and sha256, kept by a rerun;
 * - the MCP round trip with the SDK's own client over HTTP (test/support/mcp-client.ts).
 *
 * Needs `SANDPOD_E2E_KUBECONFIG` and `SANDPOD_E2E_IMAGE` (test/e2e/images.sh), PostgreSQL as the
 * other tests find it (test/support/db.ts); skipped without a kubeconfig.
 */
import { randomUUID } from 'node:crypto';
import { readdirSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import { BatchV1Api, CoreV1Api, KubeConfig, type KubernetesObject, type V1Pod } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { applyObjects, manifestObjects } from '../support/kube-apply.ts';
import { b64, expectInputFilesSeen, INPUT_FILES_REQUEST, sha } from '../support/input-files.ts';
import { call, closeMcpClients, httpClient, MCP_TOOLS, ok, RUN, sessionRoundTrip } from '../support/mcp-client.ts';
import { listen, startTestService, type TestService } from '../support/service.ts';
import { expectSessionFilesApi, type Send } from '../support/session-files.ts';

const KUBECONFIG = process.env.SANDPOD_E2E_KUBECONFIG;
const IMAGE = process.env.SANDPOD_E2E_IMAGE ?? 'ghcr.io/sandpod/executor:0.1.0';
const GVISOR = process.env.SANDPOD_E2E_GVISOR === '1';
const NS = 'sandpod-e2e';
const RUNS_NS = 'sandpod-e2e-jobs';
const TOKEN = 'e2e-agents-token-0123456789abcdef';
/** A cold session or run pod on a loaded 2-core node under gVisor takes seconds to tens of seconds. */
const SLOW_MS = 300_000;

type J = Record<string, any>;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.skipIf(!KUBECONFIG)('agents over HTTP on a real cluster (needs SANDPOD_E2E_KUBECONFIG)', () => {
  const instance = `e2e-agents-${randomUUID().slice(0, 6)}`;
  let kc: KubeConfig;
  let svc: TestService;
  let server: ServerType | undefined;
  let port = 0;
  let url = '';
  let savedKubeconfig: string | undefined;

  /** One request as sent on the wire (node:http: the path is not normalised), with the token. */
  const send: Send = (method, path, body, headers = {}) =>
    new Promise<Response>((resolve, reject) => {
      const data = body === undefined ? undefined : Buffer.from(body);
      const req = http.request({ host: '127.0.0.1', port, method, path, headers: { authorization: `Bearer ${TOKEN}`, ...headers, ...(data ? { 'content-length': String(data.length) } : {}) } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          const h = new Headers();
          for (const [k, val] of Object.entries(res.headers)) if (val !== undefined) h.set(k, Array.isArray(val) ? val.join(', ') : val);
          const status = res.statusCode ?? 0;
          const noBody = method === 'HEAD' || status === 204 || status === 304;
          resolve(new Response(noBody ? null : Buffer.concat(chunks), { status, headers: h }));
        });
      });
      req.on('error', reject);
      req.end(data);
    });
  const json = async (res: Response) => (await res.json()) as J;
  const post = (path: string, body: unknown) => send('POST', path, JSON.stringify(body), { 'content-type': 'application/json' });
  const get = async (path: string) => json(await send('GET', path));
  const create = async (body: J = {}) => {
    const res = await post('/sessions', body);
    const j = await json(res);
    expect(res.status, JSON.stringify(j)).toBe(201);
    return j;
  };
  const exec = async (id: string, body: J) => {
    const res = await post(`/sessions/${id}/execute`, body);
    const j = await json(res);
    expect(res.status, JSON.stringify(j)).toBe(200);
    return j;
  };
  const close = (id: string) => send('DELETE', `/sessions/${id}`);
  const podsOf = async (sessionId: string): Promise<V1Pod[]> =>
    (await kc.makeApiClient(CoreV1Api).listNamespacedPod({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance},sandpod.io/session-id=${sessionId}` })).items.filter((p) => !p.metadata?.deletionTimestamp);
  const sessionPool = async (): Promise<J | undefined> => ((await get('/pool/stats')).sessions as J[]).find((x) => x.job_type === 'default');
  /** Waits for a session to reach `status` (the end of a session is noticed asynchronously). */
  const sessionBecomes = async (id: string, status: string, ms = 60_000): Promise<J> => {
    const end = Date.now() + ms;
    for (;;) {
      const s = await get(`/sessions/${id}`);
      if (s.status === status || Date.now() > end) return s;
      await sleep(250);
    }
  };

  beforeAll(async () => {
    kc = new KubeConfig();
    kc.loadFromFile(KUBECONFIG!);
    const objs: KubernetesObject[] = manifestObjects([
      ...readdirSync(new URL('../../crds/', import.meta.url)).filter((f) => f.endsWith('.yaml')).map((f) => new URL(`../../crds/${f}`, import.meta.url)),
      ...['namespaces.yaml', 'runtimeclass.yaml', 'jobtypes.yaml'].map((f) => new URL(`./manifests/${f}`, import.meta.url)),
    ]);
    await applyObjects(kc, objs);
    // The service finds the cluster as main.ts does: KUBECONFIG.
    savedKubeconfig = process.env.KUBECONFIG;
    process.env.KUBECONFIG = KUBECONFIG;
    svc = await startTestService({
      runtime: 'kubernetes',
      security_mode: GVISOR ? 'strict' : 'permissive',
      auth: { tokens: [TOKEN] },
      max_sessions: 6,
      max_artifact_bytes: 1024 * 1024,
      warm_pool: { session_sizes: { default: 1 } },
      kubernetes: {
        namespace: NS,
        runs_namespace: RUNS_NS,
        instance,
        runtime_class: GVISOR ? 'gvisor-e2e' : 'no-such-runtime-class',
        executor_image: IMAGE,
        ttl_seconds_after_finished: 120,
        preflight: false,
        warm_pool_size: 0,
        leader_election: { lease_name: `sandpod-leader-${instance}` },
      },
    });
    server = await listen(svc, 0, '127.0.0.1');
    port = (server.address() as AddressInfo).port;
    url = `http://127.0.0.1:${port}`;
  }, SLOW_MS);

  afterAll(async () => {
    await closeMcpClients();
    const s = server;
    if (s) await new Promise<void>((r) => s.close(() => r()));
    await svc?.close();
    if (savedKubeconfig === undefined) delete process.env.KUBECONFIG;
    else process.env.KUBECONFIG = savedKubeconfig;
    await kc
      ?.makeApiClient(BatchV1Api)
      .deleteCollectionNamespacedJob({ namespace: RUNS_NS, labelSelector: `sandpod.io/instance=${instance}`, propagationPolicy: 'Background' })
      .catch(() => undefined);
  }, 120_000);

  let pooled: J;

  it('the first session of default is taken from the session pool: warm in its view, a pooled pod under the RuntimeClass; state across cells; cells are records', async () => {
    const t0 = Date.now();
    while (((await sessionPool())?.ready ?? 0) < 1) {
      if (Date.now() - t0 > 240_000) throw new Error(`no pooled session pod ready in 240 s: ${JSON.stringify(await get('/pool/stats'))}`);
      await sleep(500);
    }
    const before = (await sessionPool())!;
    const t1 = Date.now();
    pooled = await create({ idle_timeout: 900 });
    const openMs = Date.now() - t1;
    expect(pooled).toMatchObject({ status: 'ready', job_type: 'default', cells: 0, warm: true });
    expect(await get(`/sessions/${pooled.session_id}`)).toMatchObject({ warm: true, status: 'ready' });
    const listed = ((await get('/sessions?status=ready')).items as J[]).find((x) => x.session_id === pooled.session_id);
    expect(listed).toMatchObject({ warm: true });
    expect((await sessionPool())!.hits).toBe(before.hits + 1);
    const pods = await podsOf(pooled.session_id);
    expect(pods).toHaveLength(1);
    expect(pods[0]!.metadata?.labels?.['job-name']).toMatch(/^sps-p-/);
    if (GVISOR) expect(pods[0]!.spec?.runtimeClassName).toBe('gvisor-e2e');

    const c1 = await exec(pooled.session_id, { code: 'rows = [1, 2, 3]\nopen("data.csv", "w").write("a\\n")\nprint("loaded")' });
    expect(c1).toMatchObject({ success: true, stdout: 'loaded\n', cell: 1, session_id: pooled.session_id });
    const c2 = await exec(pooled.session_id, {
      code: 'import json\nd = json.load(open("/input/data.json"))\njson.dump({"sum": sum(rows) + d["n"], "csv": open("data.csv").read()}, open("/output/result.json", "w"))\nopen("/output/plot.txt", "w").write("p")',
      input_data: { n: 10 },
    });
    expect(c2).toMatchObject({ success: true, output: { sum: 16, csv: 'a\n' }, cell: 2 });
    const rec = await get(`/jobs/${c2.execution_id}?view=full`);
    expect(rec).toMatchObject({ status: 'succeeded', relationship: 'session', session_id: pooled.session_id, cell: 2 });
    expect(rec.artifacts.map((a: J) => a.name)).toEqual(['plot.txt']);
    expect(await (await send('GET', `/jobs/${c2.execution_id}/artifacts/plot.txt`)).text()).toBe('p');
    expect(await get(`/sessions/${pooled.session_id}`)).toMatchObject({ status: 'ready', cells: 2 });
    console.log(`a pooled session pod ready ${t1 - t0} ms after the service started; POST /sessions from the pool ${openMs} ms`);
  }, SLOW_MS);

  it('two sessions see neither each other\'s variables, files nor processes', async () => {
    const a = pooled;
    const b = await create();
    expect((await podsOf(b.session_id))[0]!.metadata?.name).not.toBe((await podsOf(a.session_id))[0]!.metadata?.name);
    // a starts a process of its own, marked so that nothing else matches it.
    const mark = `sp-mark-${randomUUID().slice(0, 8)}`;
    expect(await exec(a.session_id, { code: `secret = 42\nopen("mine.txt", "w").write("a")\nimport subprocess, sys\np = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "${mark}"])` })).toMatchObject({ success: true });
    const PROBE = `import os, json\ncmds = []\nfor q in os.listdir("/proc"):\n    if q.isdigit():\n        try:\n            cmds.append(open("/proc/%s/cmdline" % q, "rb").read().replace(b"\\0", b" ").decode())\n        except OSError:\n            pass\nprint(json.dumps({"secret": "secret" in globals(), "file": os.path.exists("mine.txt"), "ls": sorted(os.listdir(".")), "mark": any("${mark}" in c for c in cmds), "n": len(cmds)}))\nprint(json.dumps(sorted(c[:60] for c in cmds)))`;
    // The probe sees a's own process in a (so it can fail), and nothing of a's in b. (Not just any
    // "sleep": each pod's runner is `python3 -c <its source>`, and that source has the word.)
    const inA = (await exec(a.session_id, { code: PROBE })).stdout.split('\n');
    const inB = (await exec(b.session_id, { code: PROBE })).stdout.split('\n');
    console.log(`processes seen in a: ${inA[1]}; in b: ${inB[1]}`);
    expect(JSON.parse(inA[0]!)).toMatchObject({ secret: true, file: true, ls: expect.arrayContaining(['mine.txt']), mark: true });
    expect(JSON.parse(inB[0]!)).toMatchObject({ secret: false, file: false, ls: [], mark: false });
    expect((await get(`/sessions/${b.session_id}/files`)).items).toEqual([]);
    expect((await send('GET', `/sessions/${b.session_id}/files/mine.txt`)).status).toBe(404);
    expect(await (await send('GET', `/sessions/${a.session_id}/files/mine.txt`)).text()).toBe('a');
    for (const s of [a, b]) expect(await json(await close(s.session_id))).toMatchObject({ status: 'ended', end_reason: 'closed' });
    expect((await post(`/sessions/${a.session_id}/execute`, { code: 'print(secret)' })).status).toBe(409);
  }, SLOW_MS);

  it('the files API on every route: traversal, absolute and encoded names, planted links, directories and FIFOs refused', async () => {
    const s = await create();
    await expectSessionFilesApi(send, s.session_id, (code) => exec(s.session_id, { code }), svc.config.max_artifact_bytes, { fifo: GVISOR ? 'unseen' : 'refused' });
  }, SLOW_MS);

  it('a cell that ignores its interrupt is killed with its sandbox: the session ends crashed, its Job goes', async () => {
    const s = await create();
    await exec(s.session_id, { code: 'x = 5' });
    const job = (await podsOf(s.session_id))[0]!.metadata!.labels!['job-name']!;
    const timedOut = await exec(s.session_id, { code: 'x = 6\nimport time\nwhile True: time.sleep(0.05)', timeout: 2 });
    expect(timedOut).toMatchObject({ success: false, error: { type: 'execution_timeout' } });
    expect(await exec(s.session_id, { code: 'print(x)' })).toMatchObject({ success: true, stdout: '6\n' });
    const stubborn = await exec(s.session_id, { code: 'import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)', timeout: 2 });
    expect(stubborn).toMatchObject({ success: false, error: { type: 'execution_timeout' } });
    expect(await sessionBecomes(s.session_id, 'ended')).toMatchObject({ status: 'ended', end_reason: 'crashed' });
    expect((await post(`/sessions/${s.session_id}/execute`, { code: 'print(x)' })).status).toBe(409);
    const batch = kc.makeApiClient(BatchV1Api);
    const t0 = Date.now();
    for (;;) {
      const j = await batch.readNamespacedJob({ namespace: RUNS_NS, name: job }).catch(() => null);
      if (!j || j.metadata?.deletionTimestamp) break;
      if (Date.now() - t0 > 60_000) throw new Error(`the crashed session's Job ${job} was not deleted`);
      await sleep(500);
    }
  }, SLOW_MS);

  it('a cell whose interpreter is killed (not by the memory limit) is `killed`, and the session ends crashed', async () => {
    const s = await create();
    await exec(s.session_id, { code: 'x = 1' });
    const killed = await exec(s.session_id, { code: 'import os, signal\nprint("going", flush=True)\nos.kill(os.getpid(), signal.SIGKILL)' });
    expect(killed).toMatchObject({ success: false, stdout: 'going\n', error: { type: 'killed' } });
    expect(await sessionBecomes(s.session_id, 'ended')).toMatchObject({ status: 'ended', end_reason: 'crashed' });
    expect((await get(`/jobs/${killed.execution_id}`)).status).toBe('failed');
    expect((await post(`/sessions/${s.session_id}/execute`, { code: 'print(x)' })).status).toBe(409);
  }, SLOW_MS);

  it('input_files on a one-shot run: under /input/files/, read-only, exact bytes; on the record with size and sha256', async () => {
    const res = await post('/execute', { ...INPUT_FILES_REQUEST, startup_timeout: 240 });
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(200);
    const rec = await get(`/jobs/${body.execution_id}?view=full`);
    const dl = await send('GET', `/jobs/${body.execution_id}/artifacts/bin.dat`);
    expectInputFilesSeen(body, rec, Buffer.from(await dl.arrayBuffer()));
  }, SLOW_MS);

  it('input_artifacts of a job the caller names: the bytes never pass through the client; the record and a rerun keep them', async () => {
    const producer = await json(await post('/execute', { code: 'open("/output/out.csv", "w").write("n\\n1\\n2\\n3\\n")', startup_timeout: 240 }));
    expect(producer.success, producer.stderr).toBe(true);
    const CONSUME = 'import json, os\nrows = open("/input/files/in.csv").read().split()\nw = "refused"\ntry:\n    open("/input/files/in.csv", "w").write("x")\n    w = "written"\nexcept OSError:\n    pass\njson.dump({"rows": rows, "extra": open("/input/files/extra.txt").read(), "write": w, "ls": sorted(os.listdir("/input/files"))}, open("/output/result.json", "w"))';
    const submitted = await post('/execute/async', { code: CONSUME, input_artifacts: [{ job_id: producer.execution_id, name: 'out.csv', as: 'in.csv' }], input_files: { 'extra.txt': b64('more') }, startup_timeout: 240 });
    expect(submitted.status).toBe(202);
    const consumer = (await json(submitted)).job_id as string;
    const c = await get(`/jobs/${consumer}/result?wait=true&timeout=240&view=full`);
    expect(c.status, c.stderr).toBe('succeeded');
    expect(c.output).toEqual({ rows: ['n', '1', '2', '3'], extra: 'more', write: 'refused', ls: ['extra.txt', 'in.csv'] });
    expect(c.input_artifacts.find((a: J) => a.name === 'in.csv')).toMatchObject({ size_bytes: 8, sha256: sha('n\n1\n2\n3\n'), path: '/input/files/in.csv', source: { job_id: producer.execution_id, name: 'out.csv' } });
    expect(c.input_artifacts.find((a: J) => a.name === 'extra.txt')).toMatchObject({ size_bytes: 4, sha256: sha('more'), path: '/input/files/extra.txt' });
    const rerun = await json(await post(`/jobs/${consumer}/rerun`, {}));
    const r = await get(`/jobs/${rerun.job_id}/result?wait=true&timeout=240&view=full`);
    expect(r).toMatchObject({ status: 'succeeded', output: c.output, parent_execution_id: consumer, relationship: 'rerun' });
    expect(r.input_artifacts).toEqual(c.input_artifacts);
    const unknown = await post('/execute', { code: 'print(1)', input_artifacts: [{ job_id: producer.execution_id, name: 'nope.csv' }] });
    expect(unknown.status).toBe(404);
  }, SLOW_MS);

  it('MCP over HTTP with the SDK client: the tools, run_python with its artifact, a session round trip, list_job_types; the API token', async () => {
    const client = await httpClient(url, TOKEN);
    expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(MCP_TOOLS);
    const r = await ok(client, 'run_python', { code: RUN }, SLOW_MS);
    expect(r).toMatchObject({ status: 'succeeded', success: true, exit_code: 0, stdout: 'hello 42\n', result: { answer: 42 }, error: null });
    expect(r.artifacts).toEqual([expect.objectContaining({ name: 'plot.txt', size_bytes: 10, url: `${url}/jobs/${r.job_id}/artifacts/plot.txt` })]);
    expect(await (await send('GET', new URL(r.artifacts[0].url).pathname)).text()).toBe('p'.repeat(10));
    await sessionRoundTrip(client, url, SLOW_MS);
    const types = await ok(client, 'list_job_types');
    expect(types.job_types).toEqual(await get('/job-types'));
    expect(types.job_types.map((t: J) => t.name)).toEqual(expect.arrayContaining(['default', 'tiny-memory']));
    const bad = await call(client, 'upload_file', { session_id: randomUUID(), name: '../etc/passwd', content: 'x' });
    expect(bad.ok).toBe(false);
    expect(bad.text).toMatch(/HTTP 4\d\d/);
    await expect(httpClient(url, 'not-the-token-0123456789')).rejects.toThrow(/401|nauthorized/);
  }, SLOW_MS * 2);
});
