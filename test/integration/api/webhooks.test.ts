/**
 * Completion webhooks on a real service (issue 21), on whichever database the run uses (the Makefile
 * runs this directory on PostgreSQL and again on PGlite):
 * - end to end with the delivery loop running: sync, async, rerun and fork submissions reach the
 *   receiver example (docs/examples/webhook-receiver.ts), which verifies the Standard Webhooks
 *   signature; two secrets (a rotation) are both valid; callbacks outside allowed_hosts are a 400;
 * - with an injected clock and the loop stopped: the retry schedule, the final failure (DLQ
 *   `webhook_failed`, the metric), the SSRF refusals at send time (a name resolving to loopback or
 *   link-local, a redirect not followed), two workers that never send one delivery twice, and the
 *   outbox written in the verdict's transaction.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startReceiver, verify, type ReceivedWebhook } from '../../../docs/examples/webhook-receiver.ts';
import { createDb } from '../../../src/store/database.ts';
import { WebhookDelivery } from '../../../src/webhooks/deliver.ts';
import { Signer } from '../../../src/webhooks/sign.ts';
import { defaultLookup } from '../../../src/webhooks/ssrf.ts';
import { silentLogger } from '../../../src/logger.ts';
import { startTestService, type TestService } from '../../support/service.ts';

type J = Record<string, any>;
const secret = () => `whsec_${randomBytes(32).toString('base64')}`;

async function until<T>(what: string, f: () => T | undefined | Promise<T | undefined>, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('webhooks end to end (delivery loop running)', () => {
  const [oldSecret, newSecret] = [secret(), secret()];
  const got: ReceivedWebhook[] = [];
  const rejected: string[] = [];
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  let svc: TestService;
  beforeAll(async () => {
    // The receiver trusts only the old secret: the service signs with both (a rotation in progress).
    receiver = await startReceiver({ secrets: [oldSecret], onWebhook: (w) => got.push(w), onRejected: (r) => rejected.push(r) });
    const port = new URL(receiver.url).port;
    svc = await startTestService({
      webhooks: { secrets: [newSecret, oldSecret], allowed_hosts: [`127.0.0.1:${port}`, '*.example.com'] },
      job_types: [{ name: 'hooked', callback_url: `${receiver.url}/by-type` }],
    });
  }, 60_000);
  afterAll(async () => {
    await svc?.close();
    await receiver?.close();
  });

  const byJob = (id: string) => until(`the webhook of ${id}`, () => got.find((w) => w.payload.data.job_id === id));

  it('async: the record arrives signed, once, with its webhook-id; GET /jobs/{id}/deliveries shows the attempt', async () => {
    const res = await svc.post('/execute/async', { code: 'print("hi")', callback_url: `${receiver.url}/done?k=1` });
    expect(res.status).toBe(202);
    const { job_id } = (await res.json()) as J;
    const w = await byJob(job_id);
    expect(w.id).toBe(`msg_${job_id}`);
    expect(w.duplicate).toBe(false);
    expect(w.payload).toMatchObject({ type: 'execution.finished', data: { execution_id: job_id, status: 'succeeded', stdout: 'hi\n', exit_code: 0 } });
    expect(Object.keys(w.payload.data)).toEqual(expect.arrayContaining(['created_at', 'started_at', 'ended_at', 'duration_ms', 'timing', 'job_version']));
    expect(rejected).toEqual([]);
    const d = (await until('the delivery to be recorded', async () => {
      const body = (await (await svc.get(`/jobs/${job_id}/deliveries`)).json()) as J;
      return body.deliveries[0]?.status === 'delivered' ? body : undefined;
    })) as J;
    expect(d).toMatchObject({ job_id, callback_url: `${receiver.url}/done?k=1` });
    expect(d.deliveries[0]).toMatchObject({ webhook_id: `msg_${job_id}`, attempt_count: 1, last_status_code: 204, next_attempt_at: null, attempts: [{ attempt: 1, status_code: 204, error: null, outcome: 'delivered' }] });
    expect(d.deliveries[0].attempts[0].duration_ms).toBeGreaterThanOrEqual(0);
    const full = (await (await svc.get(`/jobs/${job_id}?view=full`)).json()) as J;
    expect(full.callback_url).toBe(`${receiver.url}/done?k=1`);
  }, 60_000);

  it('sync, rerun (keeps the callback), fork (names another) and the job type default all call back', async () => {
    const sync = (await (await svc.post('/execute', { code: 'print(2)', callback_url: `${receiver.url}/sync` })).json()) as J;
    expect(sync.success).toBe(true);
    const recs = (await (await svc.get('/executions?limit=1')).json()) as J;
    const syncId = recs.items[0].execution_id as string;
    expect((await byJob(syncId)).payload.data.stdout).toBe('2\n');

    const rerun = (await (await svc.post(`/jobs/${syncId}/rerun`)).json()) as J;
    expect((await byJob(rerun.job_id)).payload.data.stdout).toBe('2\n');
    expect(((await (await svc.get(`/jobs/${rerun.job_id}?view=full`)).json()) as J).callback_url).toBe(`${receiver.url}/sync`);

    const fork = (await (await svc.post(`/jobs/${syncId}/fork`, { code: 'print(3)', callback_url: `${receiver.url}/fork` })).json()) as J;
    expect((await byJob(fork.job_id)).payload.data.stdout).toBe('3\n');
    expect(((await (await svc.get(`/jobs/${fork.job_id}?view=full`)).json()) as J).callback_url).toBe(`${receiver.url}/fork`);

    const typed = (await (await svc.post('/execute/async', { code: 'print(4)', job_type: 'hooked' })).json()) as J;
    expect((await byJob(typed.job_id)).payload.data.job_type).toBe('hooked');
    // null opts out of the type's default.
    const none = (await (await svc.post('/execute/async', { code: 'print(5)', job_type: 'hooked', callback_url: null })).json()) as J;
    const rerunNone = (await (await svc.post(`/jobs/${syncId}/rerun`, { callback_url: null })).json()) as J;
    await until('both to end', async () => {
      const a = (await (await svc.get(`/jobs/${none.job_id}`)).json()) as J;
      const b = (await (await svc.get(`/jobs/${rerunNone.job_id}`)).json()) as J;
      return a.status === 'succeeded' && b.status === 'succeeded' ? true : undefined;
    });
    expect(((await (await svc.get(`/jobs/${none.job_id}/deliveries`)).json()) as J).deliveries).toEqual([]);
    expect(((await (await svc.get(`/jobs/${rerunNone.job_id}/deliveries`)).json()) as J).deliveries).toEqual([]);
  }, 90_000);

  it.skipIf(process.getuid?.() !== 0)('a session\'s cells call back: their own callback_url, else the session\'s job type default', async () => {
    const created = await svc.post('/sessions', { job_type: 'hooked' });
    expect(created.status).toBe(201);
    const sid = ((await created.json()) as J).session_id as string;
    try {
      const a = (await (await svc.post(`/sessions/${sid}/execute`, { code: 'x = 41', callback_url: `${receiver.url}/cell` })).json()) as J;
      const b = (await (await svc.post(`/sessions/${sid}/execute`, { code: 'print(x + 1)' })).json()) as J;
      const wa = await byJob(a.execution_id);
      const wb = await byJob(b.execution_id);
      expect(wa.payload.data).toMatchObject({ status: 'succeeded', job_type: 'hooked' });
      expect(wb.payload.data).toMatchObject({ status: 'succeeded', stdout: '42\n' });
      expect(((await (await svc.get(`/jobs/${a.execution_id}?view=full`)).json()) as J).callback_url).toBe(`${receiver.url}/cell`);
      expect(((await (await svc.get(`/jobs/${b.execution_id}?view=full`)).json()) as J).callback_url).toBe(`${receiver.url}/by-type`);
      const bad = await svc.post(`/sessions/${sid}/execute`, { code: 'print(1)', callback_url: 'http://169.254.169.254/' });
      expect(bad.status).toBe(400);
    } finally {
      await svc.app.request(`/sessions/${sid}`, { method: 'DELETE' });
    }
  }, 90_000);

  it('a cancelled job calls back too (the trigger sees every path that ends a record)', async () => {
    const sub = (await (await svc.post('/execute/async', { code: 'import time\ntime.sleep(60)', callback_url: `${receiver.url}/cancel` })).json()) as J;
    await until('the job to start', async () => (((await (await svc.get(`/jobs/${sub.job_id}`)).json()) as J).status === 'running' ? true : undefined));
    expect((await svc.post(`/jobs/${sub.job_id}/cancel`)).status).toBeLessThan(300);
    const w = await byJob(sub.job_id);
    expect(w.payload.data).toMatchObject({ status: 'cancelled', job_id: sub.job_id });
  }, 90_000);

  it('a callback outside webhooks.allowed_hosts, or at a loopback or link-local address not named there, is a 400 that says why', async () => {
    const cases: [string, string, unknown, string][] = [
      ['/execute/async', 'async', { code: 'print(1)', callback_url: 'https://evil.example.net/x' }, 'callback_url: host evil.example.net does not match webhooks.allowed_hosts'],
      ['/execute', 'sync', { code: 'print(1)', callback_url: 'http://127.0.0.1:1/x' }, 'callback_url: host 127.0.0.1:1 does not match'],
      ['/execute/async', 'link-local', { code: 'print(1)', callback_url: 'http://169.254.169.254/latest' }, 'callback_url: host 169.254.169.254 does not match'],
      ['/execute/async', 'scheme', { code: 'print(1)', callback_url: 'gopher://a.example.com/' }, 'callback_url: must use http or https, not gopher'],
      ['/execute/async', 'not a string', { code: 'print(1)', callback_url: 7 }, 'callback_url must be a string'],
    ];
    for (const [path, what, body, detail] of cases) {
      const res = await svc.post(path, body);
      const b = (await res.json()) as J;
      expect({ what, status: res.status }).toEqual({ what, status: 400 });
      expect(b.detail).toContain(detail);
    }
    const done = ((await (await svc.get('/executions?limit=1&status=succeeded')).json()) as J).items[0].execution_id;
    const fork = await svc.post(`/jobs/${done}/fork`, { code: 'print(1)', callback_url: 'http://[::1]/x' });
    expect(fork.status).toBe(400);
    const rerun = await svc.post(`/jobs/${done}/rerun`, { callback_url: 'http://10.0.0.1/x' });
    expect(rerun.status).toBe(400);
    expect(((await rerun.json()) as J).detail).toContain('callback_url: host 10.0.0.1 does not match');
  });
});

/** A receiver whose answers the test decides, counting what it got (no verification). */
async function scripted(answer: (req: IncomingMessage, res: ServerResponse, body: string) => void): Promise<{ server: Server; port: number; hits: { headers: IncomingMessage['headers']; body: string }[] }> {
  const hits: { headers: IncomingMessage['headers']; body: string }[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      hits.push({ headers: req.headers, body });
      answer(req, res, body);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port, hits };
}

describe('delivery decisions with an injected clock (delivery loop stopped)', () => {
  const s = secret();
  let now = Date.now();
  const clock = { now: () => now };
  let svc: TestService;
  let plan: number[] = [];
  let target: Awaited<ReturnType<typeof scripted>>;
  let elsewhere: Awaited<ReturnType<typeof scripted>>;
  const lookup = async (host: string) => {
    const table: Record<string, string> = { 'lo.hooks.test': '127.0.0.1', 'md.hooks.test': '169.254.169.254', 'in.hooks.test': '10.1.2.3' };
    const a = table[host];
    // Other names (localhost) go to the real resolver.
    return a ? [{ address: a, family: 4 }] : defaultLookup(host);
  };
  beforeAll(async () => {
    elsewhere = await scripted((_q, res) => res.writeHead(200).end('should never be reached'));
    target = await scripted((req, res) => {
      if (req.url?.startsWith('/redirect')) return res.writeHead(302, { location: `http://127.0.0.1:${elsewhere.port}/` }).end();
      res.writeHead(plan.shift() ?? 204).end('x'.repeat(100_000));
    });
    svc = await startTestService(
      { webhooks: { secrets: [s], allowed_hosts: ['127.0.0.1', 'localhost', '*.hooks.test'], max_attempts: 3, deliver: false } },
      { webhooks: { clock, lookup, random: () => 1 } },
    );
  }, 60_000);
  afterAll(async () => {
    await svc?.close();
    for (const x of [target, elsewhere]) await new Promise((r) => x?.server.close(r));
  });

  const runJob = async (callback_url: string): Promise<string> => {
    expect((await svc.post('/execute', { code: 'print(1)', callback_url })).status).toBe(200);
    return ((await (await svc.get('/executions?limit=1')).json()) as J).items[0].execution_id;
  };
  const counts = async (): Promise<Record<'delivered' | 'retried' | 'failed', number>> => {
    const text = await (await svc.get('/metrics')).text();
    const of = (o: string) => Number(new RegExp(`^sandpod_webhook_deliveries_total\\{outcome="${o}"\\} (\\d+)$`, 'm').exec(text)?.[1]);
    return { delivered: of('delivered'), retried: of('retried'), failed: of('failed') };
  };
  const deliveryOf = async (id: string): Promise<J> => ((await (await svc.get(`/jobs/${id}/deliveries`)).json()) as J).deliveries[0];

  it('retries with exponential backoff until a 2xx: same webhook-id, a fresh valid signature each time', async () => {
    plan = [500, 503];
    target.hits.length = 0;
    const id = await runJob(`http://127.0.0.1:${target.port}/hook`);
    expect(await svc.webhooks!.runOnce()).toBe(1);
    let d = await deliveryOf(id);
    expect(d).toMatchObject({ status: 'pending', attempt_count: 1, last_status_code: 500, attempts: [{ attempt: 1, status_code: 500, error: 'HTTP 500', outcome: 'retried' }] });
    // Due in 25 s (base delay, jitter at its top): not before.
    expect(Date.parse(d.next_attempt_at) - now).toBe(25_000);
    now += 24_000;
    expect(await svc.webhooks!.runOnce()).toBe(0);
    now += 1_000;
    expect(await svc.webhooks!.runOnce()).toBe(1);
    d = await deliveryOf(id);
    expect(Date.parse(d.next_attempt_at) - now).toBe(50_000);
    now += 50_000;
    expect(await svc.webhooks!.runOnce()).toBe(1);
    d = await deliveryOf(id);
    expect(d).toMatchObject({ status: 'delivered', attempt_count: 3, last_status_code: 204, next_attempt_at: null });
    expect(d.attempts.map((a: J) => [a.status_code, a.outcome])).toEqual([[500, 'retried'], [503, 'retried'], [204, 'delivered']]);
    expect(target.hits).toHaveLength(3);
    expect(new Set(target.hits.map((h) => h.headers['webhook-id']))).toEqual(new Set([`msg_${id}`]));
    expect(new Set(target.hits.map((h) => h.headers['webhook-timestamp'])).size).toBe(3);
    for (const h of target.hits) expect(verify([s], h.body, h.headers)).toMatchObject({ data: { job_id: id } });
  }, 60_000);

  it('gives up after max_attempts: failed, in the DLQ as webhook_failed, counted in sandpod_webhook_deliveries_total', async () => {
    plan = [500, 500, 500];
    const before = await counts();
    const id = await runJob(`http://127.0.0.1:${target.port}/hook`);
    for (let i = 0; i < 3; i++) {
      expect(await svc.webhooks!.runOnce()).toBe(1);
      now += 3_600_000 / 60;
    }
    expect(await svc.webhooks!.runOnce()).toBe(0);
    const d = await deliveryOf(id);
    expect(d).toMatchObject({ status: 'failed', attempt_count: 3, last_error: 'gave up after 3 attempt(s) (max_attempts); last attempt: HTTP 500' });
    const dlq = ((await (await svc.get('/dlq?error_type=webhook_failed')).json()) as J).items as J[];
    const entry = dlq.find((e) => e.job_id === id);
    expect(entry).toMatchObject({ error_type: 'webhook_failed', retry_count: 2, job_data: { job_type: 'default', webhook_id: `msg_${id}` } });
    expect(entry!.error_message).toContain(`webhook to 127.0.0.1:${target.port} not delivered: gave up after 3 attempt(s)`);
    // Counted by outcome: two retried attempts and one failed, nothing delivered.
    const after = await counts();
    expect({ delivered: after.delivered - before.delivered, retried: after.retried - before.retried, failed: after.failed - before.failed }).toEqual({ delivered: 0, retried: 2, failed: 1 });
  }, 60_000);

  it('refuses at send time a name that resolves to loopback (localhost, real resolver) or to link-local or private addresses, without sending', async () => {
    const before = target.hits.length;
    const cases = [
      [`http://localhost:${target.port}/hook`, /^destination refused: localhost resolves to (127\.0\.0\.1|::1), a loopback, private or link-local address/],
      [`http://lo.hooks.test:${target.port}/hook`, /^destination refused: lo\.hooks\.test resolves to 127\.0\.0\.1/],
      ['http://md.hooks.test/latest/meta-data', /^destination refused: md\.hooks\.test resolves to 169\.254\.169\.254/],
      ['http://in.hooks.test/x', /^destination refused: in\.hooks\.test resolves to 10\.1\.2\.3/],
    ] as const;
    for (const [url, why] of cases) {
      const id = await runJob(url);
      expect(await svc.webhooks!.runOnce()).toBe(1);
      const d = await deliveryOf(id);
      expect(d.status).toBe('failed');
      expect(d.attempts).toHaveLength(1);
      expect(d.attempts[0].status_code).toBeNull();
      expect(d.last_error).toMatch(why);
    }
    expect(target.hits.length).toBe(before);
  }, 60_000);

  it('does not follow a redirect: the 302 is the attempt\'s answer and the other host gets nothing', async () => {
    plan = [];
    const id = await runJob(`http://127.0.0.1:${target.port}/redirect`);
    expect(await svc.webhooks!.runOnce()).toBe(1);
    const d = await deliveryOf(id);
    expect(d).toMatchObject({ status: 'pending', last_status_code: 302, attempts: [{ status_code: 302, error: 'HTTP 302', outcome: 'retried' }] });
    expect(elsewhere.hits).toHaveLength(0);
    // Leave nothing due for the next test.
    await svc.db.kysely.updateTable('webhook_deliveries').set({ status: 'failed' }).where('id', '=', `msg_${id}`).execute();
  }, 60_000);

  it('two workers claiming at once send each delivery once (SKIP LOCKED + lease)', async () => {
    target.hits.length = 0;
    plan = [];
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) ids.push(await runJob(`http://127.0.0.1:${target.port}/hook`));
    const other = svc.database.url ? await createDb({ url: svc.database.url, workspace: svc.database.workspace }) : svc.db;
    try {
      const cfg = { ...svc.config.webhooks, concurrency: 4 };
      const second = new WebhookDelivery({ db: other, config: cfg, signer: new Signer([s]), logger: silentLogger, clock, lookup });
      const first = new WebhookDelivery({ db: svc.db, config: cfg, signer: new Signer([s]), logger: silentLogger, clock, lookup });
      const [a, b] = await Promise.all([first.runOnce(), second.runOnce()]);
      expect(a + b).toBe(6);
      expect(await first.runOnce()).toBe(0);
    } finally {
      if (other !== svc.db) await other.destroy();
    }
    expect(target.hits.map((h) => h.headers['webhook-id']).sort()).toEqual(ids.map((id) => `msg_${id}`).sort());
  }, 60_000);

  it('the outbox row is written in the verdict\'s transaction: none when it rolls back, one when it commits', async () => {
    const id = await runJob(`http://127.0.0.1:${target.port}/hook`);
    await svc.db.kysely.deleteFrom('webhook_deliveries').where('execution_id', '=', id).execute();
    await svc.db.kysely.updateTable('executions').set({ status: 'running' }).where('id', '=', id).execute();
    await expect(
      svc.db.kysely.transaction().execute(async (tx) => {
        await tx.updateTable('executions').set({ status: 'succeeded' }).where('id', '=', id).execute();
        const n = await sql<{ n: number }>`SELECT count(*)::int AS n FROM webhook_deliveries WHERE execution_id = ${id}`.execute(tx);
        expect(n.rows[0]!.n).toBe(1);
        throw new Error('roll back');
      }),
    ).rejects.toThrow('roll back');
    expect(await svc.db.kysely.selectFrom('webhook_deliveries').select('id').where('execution_id', '=', id).execute()).toEqual([]);
    await svc.db.kysely.updateTable('executions').set({ status: 'succeeded' }).where('id', '=', id).execute();
    expect(await svc.db.kysely.selectFrom('webhook_deliveries').select('id').where('execution_id', '=', id).execute()).toEqual([{ id: `msg_${id}` }]);
  }, 60_000);
});
