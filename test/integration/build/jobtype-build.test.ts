/**
 * Job-type builds (SPEC §4.9, issue #11) end to end on the local runtime: real service, real database
 * (PostgreSQL or PGlite, see test/support/db.ts), real sandbox, real pip against a wheel directory the
 * test builds (no PyPI here).
 */
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, readdirSync, renameSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, unmountUnder, type TestDatabase } from '../../support/db.ts';
import { startTestService, type TestService } from '../../support/service.ts';
import { buildWheels } from '../../support/wheel.ts';
import { serveWheelIndex, type WheelIndex } from '../../support/wheel-index.ts';
import { FileJobTypeRegistry } from '../../../src/jobtypes/job-type.ts';
import { getBuild, insertBuilding } from '../../../src/store/builds.repository.ts';

type J = Record<string, any>;

/** A wheel directory with `sandpod-bt` 1.0.0 and 1.1.0 and `sandpod-other` 2.0.0. */
function wheels(versions = ['1.0.0', '1.1.0']): string {
  const dir = buildWheels(versions.map((version) => ({ name: 'sandpod-bt', version })));
  buildWheels([{ name: 'sandpod-other', version: '2.0.0' }], dir);
  return dir;
}

function sha256File(file: string): string {
  return createHash('sha256').update(readFileSync(file)).digest('hex');
}

const PRINT_VERSION = 'import sandpod_bt\nprint(sandpod_bt.VALUE)';

function jobTypes() {
  return [
    { name: 'bt', requirements: ['sandpod-bt==1.0.0'] },
    { name: 'bt-twin', requirements: ['sandpod-bt==1.0.0'] },
    { name: 'bt-new', requirements: ['sandpod-bt==1.1.0'] },
    { name: 'bt-two', requirements: ['sandpod-bt==1.0.0', 'sandpod-other'] },
  ];
}

async function json(res: Response | Promise<Response>): Promise<{ status: number; body: J; headers: Headers }> {
  const r = await res;
  return { status: r.status, body: (await r.json()) as J, headers: r.headers };
}

async function waitRecord(svc: TestService, id: string): Promise<J> {
  const r = await json(svc.get(`/jobs/${id}/result?wait=true&timeout=60&view=full`));
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body;
}

describe('POST /job-types/{name}/build (local runtime)', () => {
  let svc: TestService;
  let wheelDir: string;

  beforeAll(async () => {
    wheelDir = wheels();
    svc = await startTestService({ job_types: jobTypes(), pip: { find_links: [wheelDir], no_index: true } });
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  it('version_tag: a semantic version in the query or the body; anything else is 400; unknown type 404', async () => {
    for (const bad of ['banana', 'v1.2.0', '1.2', '01.2.3', '1.2.3-']) {
      const q = await json(svc.post(`/job-types/bt/build?version_tag=${encodeURIComponent(bad)}`));
      expect(q.status, bad).toBe(400);
      expect(q.body).toMatchObject({ code: 'validation_error', detail: expect.stringContaining('version_tag') });
      const b = await json(svc.post('/job-types/bt/build', { version_tag: bad }));
      expect(b.status, bad).toBe(400);
    }
    expect((await json(svc.post('/job-types/bt/build', { version_tag: 3 }))).status).toBe(400);
    expect((await json(svc.post('/job-types/bt/build', { tag: '1.0.0' }))).status).toBe(400);
    expect((await json(svc.post('/job-types/bt/build?version_tag=1.0.0', { version_tag: '2.0.0' }))).status).toBe(400);
    expect((await json(svc.post('/job-types/bt/build', '[1]'))).status).toBe(400);
    const nope = await json(svc.post('/job-types/nope/build'));
    expect(nope.status).toBe(404);
    expect(nope.body.code).toBe('not_found');
    // Nothing was recorded for the refused requests.
    expect((await json(svc.get('/job-types/bt/builds'))).body).toEqual([]);
  });

  it('builds: status built, version <type>@sha256:<digest>, the lock with wheel hashes, duration; the type shows it', async () => {
    const r = await json(svc.post('/job-types/bt/build?version_tag=1.4.0-rc.1'));
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const b = r.body;
    expect(b).toMatchObject({ status: 'built', job_type: 'bt', version_tag: '1.4.0-rc.1', phase: 'built', python_version: '3.11', requirements: ['sandpod-bt==1.0.0'], error: null });
    expect(b.digest).toMatch(/^[0-9a-f]{64}$/);
    expect(b.version).toBe(`bt@sha256:${b.digest}`);
    expect(b.duration_ms).toBeGreaterThanOrEqual(0);
    expect(b.resolved_requirements).toEqual([{ name: 'sandpod-bt', version: '1.0.0', sha256: sha256File(path.join(wheelDir, 'sandpod_bt-1.0.0-py3-none-any.whl')) }]);
    // The environment: content-addressed, read-only, with its lock file.
    // image_ref names the environment without saying where the workspace is (issue 22).
    expect(b.image_ref).toBe(`local:sha256:${b.digest}`);
    const envs = readdirSync(svc.database.workspace, { recursive: true }).map(String).filter((p) => p.endsWith(`envs/${b.digest}`));
    expect(envs).toHaveLength(1);
    const dir = path.join(svc.database.workspace, envs[0]!);
    expect(readFileSync(path.join(dir, 'requirements.lock'), 'utf8')).toBe(`sandpod-bt==1.0.0 --hash=sha256:${b.resolved_requirements[0].sha256}\n`);
    expect(existsSync(path.join(dir, 'site', 'sandpod_bt', '__init__.py'))).toBe(true);
    for (const p of [dir, path.join(dir, 'site'), path.join(dir, 'site', 'sandpod_bt', '__init__.py')]) expect(statSync(p).mode & 0o222, p).toBe(0);

    const view = (await json(svc.get('/job-types/bt'))).body;
    expect(view).toMatchObject({ name: 'bt', image_exists: true, version: '1.4.0-rc.1', digest: b.digest, job_ref: b.version, image_ref: b.image_ref });
    const listed = ((await json(svc.get('/job-types'))).body as J[]).find((t) => t.name === 'bt');
    expect(listed).toMatchObject({ image_exists: true, digest: b.digest });
    // An unbuilt type says so.
    expect((await json(svc.get('/job-types/bt-new'))).body).toMatchObject({ image_exists: false, digest: null, version: 'latest' });
    // The build is a record.
    const rec = await json(svc.get(`/job-types/bt/builds/${b.id}`));
    expect(rec.body).toEqual(b);
    expect((await json(svc.get('/job-types/bt/builds/not-a-build'))).status).toBe(404);
  }, 120_000);

  it('the same inputs give the same digest; a changed or added requirement gives a new one', async () => {
    const a = (await json(svc.post('/job-types/bt/build'))).body;
    const again = (await json(svc.post('/job-types/bt/build'))).body;
    const twin = (await json(svc.post('/job-types/bt-twin/build'))).body;
    const newer = (await json(svc.post('/job-types/bt-new/build'))).body;
    const two = (await json(svc.post('/job-types/bt-two/build'))).body;
    expect([a.status, again.status, twin.status, newer.status, two.status]).toEqual(['built', 'built', 'built', 'built', 'built']);
    expect(again.id).not.toBe(a.id);
    expect(again.digest).toBe(a.digest);
    expect(twin.digest).toBe(a.digest);
    expect(twin.version).toBe(`bt-twin@sha256:${a.digest}`);
    expect(newer.digest).not.toBe(a.digest);
    expect(newer.resolved_requirements).toMatchObject([{ name: 'sandpod-bt', version: '1.1.0' }]);
    expect(two.digest).not.toBe(a.digest);
    expect(two.resolved_requirements.map((l: J) => `${l.name}==${l.version}`)).toEqual(['sandpod-bt==1.0.0', 'sandpod-other==2.0.0']);
    // No tag: the type's label is `latest` again.
    expect((await json(svc.get('/job-types/bt'))).body).toMatchObject({ version: 'latest', digest: a.digest });
  }, 180_000);

  it('two concurrent builds of one type are one build with one answer', async () => {
    const before = ((await json(svc.get('/job-types/bt-new/builds'))).body as J[]).length;
    const [x, y] = await Promise.all([json(svc.post('/job-types/bt-new/build')), json(svc.post('/job-types/bt-new/build'))]);
    expect([x.status, y.status]).toEqual([200, 200]);
    expect(y.body).toEqual(x.body);
    expect(((await json(svc.get('/job-types/bt-new/builds'))).body as J[]).length).toBe(before + 1);
  }, 120_000);

  it('a build whose replica stopped renewing its lease is taken over', async () => {
    const jt = new FileJobTypeRegistry(svc.config).get('bt-two')!;
    const stale = await insertBuilding(svc.db.kysely, {
      id: 'dead-replica-build',
      jobType: 'bt-two',
      inputKey: svc.runtime.builder!.inputKey(jt, jt.requirements),
      versionTag: null,
      requirements: jt.requirements,
      pythonVersion: '3.11',
      owner: 'a-replica-that-died',
      now: new Date(Date.now() - 10 * 60_000),
    });
    expect(stale?.status).toBe('building');
    const r = await json(svc.post('/job-types/bt-two/build'));
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    expect(r.body.id).not.toBe('dead-replica-build');
    expect(await getBuild(svc.db.kysely, 'bt-two', 'dead-replica-build')).toMatchObject({ status: 'failed', error: expect.stringContaining('lease expired') });
  }, 120_000);

  it('wait=false answers 202 with the build to follow; it ends built', async () => {
    const r = await json(svc.post('/job-types/bt-two/build?wait=false'));
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ status: 'building', job_type: 'bt-two', digest: null, version: null });
    expect(r.headers.get('location')).toBe(`/job-types/bt-two/builds/${r.body.id}`);
    let b: J = r.body;
    for (let i = 0; i < 600 && b.status === 'building'; i++) {
      await new Promise((res) => setTimeout(res, 100));
      b = (await json(svc.get(r.headers.get('location')!))).body;
      expect(['queued', 'installing', 'publishing', 'built']).toContain(b.phase);
    }
    expect(b).toMatchObject({ status: 'built', phase: 'built' });
  }, 120_000);

  it('a run of a built type installs nothing, needs no index at start, and records the build it ran in', async () => {
    const built = (await json(svc.post('/job-types/bt/build?version_tag=3.0.0'))).body;
    // Take the wheels away (the directory stays: the sandboxes bind it): a run that tried to install would fail.
    const hidden = mkdtempSync(path.join(tmpdir(), 'sandpod-hidden-wheels-'));
    const files = readdirSync(wheelDir);
    for (const f of files) renameSync(path.join(wheelDir, f), path.join(hidden, f));
    try {
      const installing = await json(svc.post('/execute', { code: 'print(1)', job_type: 'bt', requirements: ['sandpod-other'] }));
      expect(installing.body, 'the control: installing now fails').toMatchObject({ success: false, error: { type: 'dependency_error' } });
      const sub = await json(svc.post('/execute/async', { code: PRINT_VERSION, job_type: 'bt' }));
      expect(sub.status).toBe(202);
      const rec = await waitRecord(svc, sub.body.job_id);
      expect(rec, JSON.stringify(rec)).toMatchObject({ status: 'succeeded', stdout: 'sandpod-bt-1.0.0\n', job_version: '3.0.0', job_ref: built.version });
      expect(rec.timing.dep_install_ms).toBe(0);
      // The same for the sync endpoint.
      const sync = await json(svc.post('/execute', { code: PRINT_VERSION, job_type: 'bt' }));
      expect(sync.body).toMatchObject({ success: true, stdout: 'sandpod-bt-1.0.0\n' });
    } finally {
      for (const f of files) renameSync(path.join(hidden, f), path.join(wheelDir, f));
    }
  }, 120_000);

  it('a failing build is 422 build_failed with pip\'s message, recorded as failed', async () => {
    const bad = await startTestService({ job_types: [{ name: 'broken', requirements: ['sandpod-not-there'] }], pip: { find_links: [wheelDir], no_index: true } });
    try {
      const r = await json(bad.post('/job-types/broken/build'));
      expect(r.status).toBe(422);
      expect(r.body).toMatchObject({ code: 'build_failed', build: { status: 'failed', phase: 'failed', error: expect.stringContaining('sandpod-not-there') } });
      expect((await json(bad.get('/job-types/broken'))).body).toMatchObject({ image_exists: false });
    } finally {
      await bad.close();
    }
  }, 120_000);
});

describe('pinning: a run keeps the build its record names after a rebuild', () => {
  let db: TestDatabase;
  let wheelDir: string;
  beforeAll(async () => {
    db = await freshDatabase();
    wheelDir = wheels(['1.0.0']);
  });
  afterAll(async () => {
    await db?.drop();
  });

  it('queued before and after a rebuild that resolves a newer version: each runs in its own build', async () => {
    const config = { job_types: [{ name: 'pin', requirements: ['sandpod-bt'] }], pip: { find_links: [wheelDir], no_index: true } };
    // An API-only replica: builds and accepts, runs nothing.
    const api = await startTestService({ ...config, dispatch: false }, {}, db);
    let first: J;
    let second: J;
    let ids: string[];
    try {
      first = (await json(api.post('/job-types/pin/build', { version_tag: '1.0.0' }))).body;
      const r1 = (await json(api.post('/execute/async', { code: PRINT_VERSION, job_type: 'pin' }))).body;
      buildWheels([{ name: 'sandpod-bt', version: '1.1.0' }], wheelDir);
      second = (await json(api.post('/job-types/pin/build', { version_tag: '1.1.0' }))).body;
      expect(second.digest).not.toBe(first.digest);
      expect((await json(api.get('/job-types/pin'))).body).toMatchObject({ version: '1.1.0', digest: second.digest });
      const r2 = (await json(api.post('/execute/async', { code: PRINT_VERSION, job_type: 'pin' }))).body;
      ids = [r1.job_id, r2.job_id];
    } finally {
      await api.close();
    }
    const worker = await startTestService(config, {}, db);
    try {
      const [a, b] = [await waitRecord(worker, ids[0]!), await waitRecord(worker, ids[1]!)];
      expect(a).toMatchObject({ status: 'succeeded', stdout: 'sandpod-bt-1.0.0\n', job_version: '1.0.0', job_ref: first.version });
      expect(b).toMatchObject({ status: 'succeeded', stdout: 'sandpod-bt-1.1.0\n', job_version: '1.1.0', job_ref: second.version });
      expect([a.timing.dep_install_ms, b.timing.dep_install_ms]).toEqual([0, 0]);
    } finally {
      await worker.close();
    }
  }, 240_000);
});

describe('production_mode', () => {
  let svc: TestService;
  beforeAll(async () => {
    const wheelDir = wheels(['1.0.0']);
    svc = await startTestService({ production_mode: true, job_types: [{ name: 'prod', requirements: ['sandpod-bt==1.0.0'] }], pip: { find_links: [wheelDir], no_index: true } });
  }, 120_000);
  afterAll(async () => {
    await svc?.close();
  });

  it('/health reports it', async () => {
    expect((await json(svc.get('/health'))).body.production_mode).toBe(true);
  });

  it('refuses a run of an unbuilt type with requirements (config_error saying how to build); runs it once built', async () => {
    for (const path of ['/execute', '/execute/async']) {
      const r = await json(svc.post(path, { code: PRINT_VERSION, job_type: 'prod' }));
      expect(r.status, path).toBe(400);
      expect(r.body).toMatchObject({ code: 'config_error', detail: expect.stringContaining('POST /job-types/prod/build') });
    }
    // A type without requirements needs no build.
    expect((await json(svc.post('/execute', { code: 'print(1)' }))).body).toMatchObject({ success: true, stdout: '1\n' });
    expect((await json(svc.post('/job-types/prod/build'))).status).toBe(200);
    const ok = await json(svc.post('/execute', { code: PRINT_VERSION, job_type: 'prod' }));
    expect(ok.body).toMatchObject({ success: true, stdout: 'sandpod-bt-1.0.0\n' });
    // Requirements beyond the type's would be installed at start: refused.
    const extra = await json(svc.post('/execute', { code: 'print(1)', job_type: 'prod', requirements: ['sandpod-bt==1.0.0', 'anything'] }));
    expect(extra.status).toBe(400);
    expect(extra.body.code).toBe('config_error');
  }, 120_000);
});

describe('two replicas on one database build once', () => {
  let a: TestService;
  let b: TestService;
  let wsB: string;
  let index: WheelIndex;
  beforeAll(async () => {
    // The wheel downloads wait for the test: the build cannot finish before both replicas have asked
    // for it, however slowly either request arrives.
    index = await serveWheelIndex(wheels(['1.0.0']), { gated: true });
    const config = { job_types: [{ name: 'rep', requirements: ['sandpod-bt==1.0.0'] }], pip: { find_links: [index.url], no_index: true } };
    a = await startTestService(config);
    wsB = mkdtempSync(path.join(tmpdir(), 'sandpod-ws-'));
    chmodSync(wsB, 0o755);
    // Replica B: its own workspace (and environments), the same database.
    b = await startTestService(config, { db: { ...a.db, destroy: async () => {} } }, { ...a.database, workspace: wsB, drop: async () => unmountUnder(wsB) });
  }, 120_000);
  afterAll(async () => {
    await index?.close();
    await b?.close();
    await a?.close();
  });

  it('concurrent builds on both answer with the same build; each replica has the environment', async () => {
    const before = ((await json(a.get('/job-types/rep/builds'))).body as J[]).length;
    const started = await Promise.all([json(a.post('/job-types/rep/build?wait=false')), json(b.post('/job-types/rep/build?wait=false'))]);
    expect(started.map((r) => r.status), JSON.stringify(started.map((r) => r.body))).toEqual([202, 202]);
    expect(started[1]!.body.id).toBe(started[0]!.body.id);
    // Waiting requests on either replica join that build; the downloads go through a second later.
    const waiting = Promise.all([json(a.post('/job-types/rep/build')), json(b.post('/job-types/rep/build'))]);
    setTimeout(() => index.open(), 1000);
    const [x, y] = await waiting;
    expect([x.status, y.status], JSON.stringify([x.body, y.body])).toEqual([200, 200]);
    expect(x.body.id).toBe(started[0]!.body.id);
    expect(index.paths().filter((p) => p.endsWith('.whl')).length).toBeGreaterThan(0);
    expect(y.body.id).toBe(x.body.id);
    expect(y.body.digest).toBe(x.body.digest);
    expect(((await json(a.get('/job-types/rep/builds'))).body as J[]).length - before).toBe(1);
    // B shows the build and runs in it without installing.
    expect((await json(b.get('/job-types/rep'))).body).toMatchObject({ image_exists: true, digest: x.body.digest });
    const envsB = readdirSync(path.join(wsB, 'sandbox'), { recursive: true }).map(String).filter((p) => p.endsWith(x.body.digest));
    expect(envsB.length).toBe(1);
    for (const svc of [a, b]) {
      const sub = (await json(svc.post('/execute/async', { code: PRINT_VERSION, job_type: 'rep' }))).body;
      const rec = await waitRecord(svc, sub.job_id);
      expect(rec).toMatchObject({ status: 'succeeded', stdout: 'sandpod-bt-1.0.0\n', job_ref: x.body.version });
      expect(rec.timing.dep_install_ms).toBe(0);
    }
  }, 180_000);
});

