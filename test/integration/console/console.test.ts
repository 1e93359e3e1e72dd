/**
 * The web console in a real browser (headless Chromium via playwright-core) against a real listening
 * service with a real sandbox (bubblewrap by default): submit code in the form, watch its output
 * arrive while it runs, read the run's page, download an artifact, find the run in the list; the DLQ
 * and health pages; and, with authentication on, the token prompt and an authenticated download.
 * Every page is checked for script errors and Content-Security-Policy violations.
 */
import { readFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import type { Browser, BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertDlq } from '../../../src/store/dlq.repository.ts';
import { listen, startTestService, type TestService } from '../../support/service.ts';
import { describeWithChromium, launchChromium, watchedPage } from './browser.ts';

const TOKEN = 'console-browser-token-0123456789';

/** Prints a tick a second (flushed), writes an artifact and a result, and takes about 6 s in all. */
const PROGRAM = `import json, time
data = json.load(open("/input/data.json"))
for i in range(4):
    print("tick", i, flush=True)
    time.sleep(1)
with open("/output/report.txt", "w") as f:
    f.write("report for " + data["name"] + "\\n")
with open("/output/result.json", "w") as f:
    json.dump({"greeting": "hello " + data["name"]}, f)
time.sleep(2)
`;

interface Running {
  svc: TestService;
  server: ServerType;
  base: string;
}

async function serve(config: Record<string, unknown> = {}): Promise<Running> {
  const svc = await startTestService(config);
  const server = await listen(svc, 0, '127.0.0.1');
  const { port } = server.address() as AddressInfo;
  return { svc, server, base: `http://127.0.0.1:${port}` };
}

async function stop(r: Running | undefined): Promise<void> {
  if (!r) return;
  await new Promise<void>((resolve) => r.server.close(() => resolve()));
  await r.svc.close();
}

/** Whether the service has the event stream (issue 12 point 1), told by its 404 for an unknown id: a route's 404 says "no route". */
async function hasEventStream(svc: TestService): Promise<boolean> {
  const res = await svc.get('/jobs/00000000-0000-0000-0000-000000000000/events');
  return !((await res.text()).includes('no route for'));
}

describeWithChromium('web console in Chromium', () => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await launchChromium();
  });
  afterAll(async () => browser?.close());

  describe('without authentication', () => {
    let r: Running;
    let context: BrowserContext;
    beforeAll(async () => {
      r = await serve();
      context = await browser.newContext({ acceptDownloads: true });
    });
    afterAll(async () => {
      await context?.close();
      await stop(r);
    });

    it('submit code in the form, watch its output arrive, read the run, download an artifact, find it in the list', async () => {
      const { page, problems } = await watchedPage(context);
      await page.goto(`${r.base}/ui#/submit`);
      const editor = page.locator('.cm-content');
      await editor.waitFor();
      // Highlighting: the sample's keywords are styled spans inside the editor.
      expect(await page.locator('.cm-line span').count()).toBeGreaterThan(0);
      // Typed as a user would (select all, delete, type); the program is checked below as the code that ran.
      await editor.click();
      // Undo history and the standard keys: a typed line and Control+Z bring the sample back.
      const sample = await editor.innerText();
      await page.keyboard.press('Control+End');
      await page.keyboard.type('\nundo me');
      expect(await editor.innerText()).toContain('undo me');
      await page.keyboard.press('Control+z');
      await expect.poll(() => editor.innerText()).toBe(sample);
      await page.keyboard.press('Control+A');
      await page.keyboard.press('Delete');
      await page.keyboard.insertText(PROGRAM);
      await page.locator('textarea[name=input]').fill('{"name": "console", "big": 12345678901234567890, "f": 1.0}');
      await expect.poll(() => page.locator('select[name=job_type] option').allTextContents()).toContain('default');
      await page.locator('select[name=job_type]').selectOption('default');
      await page.getByRole('button', { name: 'Run' }).click();

      await page.waitForURL(/#\/runs\/[0-9a-f-]+$/);
      const id = decodeURIComponent(new URL(page.url()).hash.split('/')[2]!);
      const stdout = page.locator('#stdout');
      if (await hasEventStream(r.svc)) {
        // Output while the program still runs (it sleeps ≥ 4 s after its first tick).
        await expect.poll(() => stdout.textContent(), { timeout: 30_000 }).toContain('tick 0');
        const now = (await (await r.svc.get(`/jobs/${id}`)).json()) as { status: string; ended_at: string | null };
        expect(now.ended_at, `output shown only once the run had ended (${now.status})`).toBeNull();
        expect(await page.locator('.follow').getAttribute('data-mode')).toBe('stream');
        expect(await page.locator('.toolbar .phase').textContent()).toBe('running');
      } else {
        // The service has no event stream yet: the page follows the run by polling GET /jobs/{id}.
        await expect.poll(() => page.locator('.follow').getAttribute('data-mode'), { timeout: 10_000 }).toBe('polling');
      }
      await expect.poll(() => page.locator('.toolbar .badge').getAttribute('data-status'), { timeout: 60_000 }).toBe('succeeded');
      expect(await stdout.textContent()).toBe('tick 0\ntick 1\ntick 2\ntick 3\n');
      expect(await page.locator('#result').textContent()).toContain('"greeting": "hello console"');
      // The input as it was written: the big integer and 1.0 keep their digits.
      const input = await page.locator('#input-data').textContent();
      expect(input).toContain('12345678901234567890');
      expect(input).toContain('1.0');
      // Timing from the record.
      expect(await page.locator('#timing').textContent()).toMatch(/Execution\s*\d/);
      // The code the editor sent is the code that ran.
      await expect.poll(() => page.locator('#code pre').textContent()).toBe(PROGRAM);

      const [download] = await Promise.all([page.waitForEvent('download'), page.locator('tr[data-artifact="report.txt"] a').click()]);
      expect(download.suggestedFilename()).toBe('report.txt');
      expect(await readFile((await download.path())!, 'utf8')).toBe('report for console\n');

      await page.goto(`${r.base}/ui#/runs`);
      const row = page.locator(`tr[data-run="${id}"]`);
      await row.waitFor();
      expect(await row.locator('.badge').getAttribute('data-status')).toBe('succeeded');
      // The status filter narrows the list (and is kept in the address).
      await page.locator('select[name=status]').selectOption('failed');
      await page.waitForURL(/status=failed/);
      await expect.poll(() => row.count()).toBe(0);
      await page.locator('select[name=status]').selectOption('succeeded');
      await expect.poll(() => row.count()).toBe(1);
      // From the list to the run's page.
      await row.locator('a').click();
      await page.waitForURL(new RegExp(`#/runs/${id}$`));
      await expect.poll(() => page.locator('#stdout').textContent()).toContain('tick 3');
      expect(problems).toEqual([]);
    });

    it('a failing run shows its error, its output as text; the runs list updates live while a run is queued and runs', async () => {
      const { page, problems } = await watchedPage(context);
      await page.goto(`${r.base}/ui#/runs`);
      await page.locator('table.runs').waitFor();
      // Output is text, never markup: what the program prints cannot run in the page.
      const markup = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>';
      const code = `import time\nprint(${JSON.stringify(markup)})\ntime.sleep(2)\nraise ValueError("bad value <b>bold</b>")`;
      const sub = (await (await r.svc.post('/execute/async', { code })).json()) as { job_id: string };
      const row = page.locator(`tr[data-run="${sub.job_id}"]`);
      // Appears without a reload, then moves to its end state.
      await row.waitFor({ timeout: 10_000 });
      await expect.poll(() => row.locator('.badge').getAttribute('data-status'), { timeout: 60_000 }).toBe('failed');
      await row.locator('a').click();
      await expect.poll(() => page.locator('#error').textContent(), { timeout: 10_000 }).toContain('bad value');
      expect(await page.locator('#stderr').textContent()).toContain('ValueError: bad value <b>bold</b>');
      expect(await page.locator('#stdout').textContent()).toBe(`${markup}\n`);
      expect(await page.locator('#stdout img, #stdout script, #error b').count()).toBe(0);
      expect(await page.evaluate('window.pwned')).toBeUndefined();
      expect(problems).toEqual([]);
    });

    it('on a service without the event stream (its 404 for the route), the run page follows by polling', async () => {
      const { page, problems } = await watchedPage(context);
      // What a service without GET /jobs/{id}/events answers there: the app's 404 for an unknown route.
      const noRoute = await r.svc.get('/no/such/route');
      const body = await noRoute.text();
      await page.route('**/jobs/*/events', (route) => route.fulfill({ status: 404, contentType: 'application/json', body }));
      const sub = (await (await r.svc.post('/execute/async', { code: 'import time\nprint("first", flush=True)\ntime.sleep(2)\nprint("second")' })).json()) as { job_id: string };
      await page.goto(`${r.base}/ui#/runs/${sub.job_id}`);
      await expect.poll(() => page.locator('.follow').getAttribute('data-mode'), { timeout: 10_000 }).toBe('polling');
      await expect.poll(() => page.locator('.toolbar .badge').getAttribute('data-status'), { timeout: 60_000 }).toBe('succeeded');
      expect(await page.locator('#stdout').textContent()).toBe('first\nsecond\n');
      expect(await page.locator('.follow').getAttribute('data-mode')).toBe('ended');
      expect(problems).toEqual([]);
      // An unknown run is one error on the page, not an endless poll (its 404s are expected here).
      await page.goto(`${r.base}/ui#/runs/00000000-0000-4000-8000-000000000000`);
      await expect.poll(() => page.locator('[role=alert]').allTextContents()).toEqual([expect.stringContaining('not found')]);
    });

    it('a run that wrote more files than a record lists says so under its artifacts', async () => {
      const code = 'for i in range(1003):\n    open(f"/output/f{i:04d}.txt", "w").write("x")';
      const done = (await (await r.svc.post('/execute', { code })).json()) as { execution_id: string };
      const { page, problems } = await watchedPage(context);
      await page.goto(`${r.base}/ui#/runs/${done.execution_id}`);
      await expect.poll(() => page.locator('#artifacts-truncated').textContent(), { timeout: 30_000 }).toBe(
        'Only the first 1000 of 1003 entries in /output are listed; the rest were not kept.',
      );
      expect(await page.locator('#artifacts tr[data-artifact]').count()).toBe(1000);
      // A run under the limit has no such line.
      const small = (await (await r.svc.post('/execute', { code: 'open("/output/one.txt", "w").write("1")' })).json()) as { execution_id: string };
      await page.goto(`${r.base}/ui#/runs/${small.execution_id}`);
      await page.locator('tr[data-artifact="one.txt"]').waitFor();
      expect(await page.locator('#artifacts-truncated').count()).toBe(0);
      expect(problems).toEqual([]);
    });

    it('the DLQ page lists entries and deletes one; the health page shows the engine and the pool', async () => {
      const done = (await (await r.svc.post('/execute', { code: 'print(1)' })).json()) as { execution_id: string };
      await insertDlq(r.svc.db.kysely, {
        jobId: done.execution_id,
        jobData: { code: 'print("from the dlq")', input_data: {}, job_type: 'default', timeout: 30 },
        errorType: 'internal_error',
        errorMessage: 'the sandbox vanished',
        retryCount: 1,
        clientIp: null,
        correlationId: 'c-console',
      });
      const { page, problems } = await watchedPage(context);
      await page.goto(`${r.base}/ui#/dlq`);
      const entry = page.locator('table.dlq tbody tr');
      await entry.first().waitFor();
      expect(await entry.count()).toBe(1);
      expect(await entry.textContent()).toContain('the sandbox vanished');
      expect(await page.locator('#dlq-total').textContent()).toBe('1 entry');
      await entry.getByRole('button', { name: 'Delete' }).click();
      await expect.poll(() => page.locator('#dlq-total').textContent()).toBe('0 entries');
      expect(((await (await r.svc.get('/dlq/stats')).json()) as { total: number }).total).toBe(0);

      await page.goto(`${r.base}/ui#/health`);
      await expect.poll(() => page.locator('#health-status').textContent()).toBe('healthy');
      const health = (await (await r.svc.get('/health')).json()) as { sandbox: { engine: string } };
      expect(await page.locator('#engine').textContent()).toContain(health.sandbox.engine);
      expect(await page.locator('#slots').textContent()).toContain(`of ${r.svc.config.max_workers}`);
      expect(problems).toEqual([]);
    });
  });

  describe('with authentication on', () => {
    let r: Running;
    let context: BrowserContext;
    beforeAll(async () => {
      r = await serve({ auth: { tokens: [TOKEN] } });
      context = await browser.newContext({ acceptDownloads: true });
    });
    afterAll(async () => {
      await context?.close();
      await stop(r);
    });

    it('asks for the token, keeps it for the tab, sends it, and downloads with it', async () => {
      const auth = { Authorization: `Bearer ${TOKEN}` };
      const done = (await (await r.svc.post('/execute', { code: 'open("/output/data.csv", "w").write("a,b\\n1,2\\n")\nprint("ok")' }, auth)).json()) as { execution_id: string; success: boolean };
      expect(done.success).toBe(true);
      const { page, problems } = await watchedPage(context);
      await page.goto(`${r.base}/ui#/runs`);
      const tokenInput = page.locator('input[name=token]');
      await tokenInput.waitFor();
      // A wrong token is refused, and the prompt says so.
      await tokenInput.fill('not-the-token-at-all');
      await page.getByRole('button', { name: 'Use token' }).click();
      await expect.poll(() => page.locator('form.token').textContent()).toContain('did not accept');
      await tokenInput.fill(TOKEN);
      await page.getByRole('button', { name: 'Use token' }).click();
      await page.locator(`tr[data-run="${done.execution_id}"]`).waitFor();
      expect(await tokenInput.count()).toBe(0);
      expect(await page.evaluate('sessionStorage.getItem("sandpod.token")')).toBe(TOKEN);

      await page.goto(`${r.base}/ui#/runs/${done.execution_id}`);
      await expect.poll(() => page.locator('#stdout').textContent(), { timeout: 15_000 }).toBe('ok\n');
      const [download] = await Promise.all([page.waitForEvent('download'), page.locator('tr[data-artifact="data.csv"] a').click()]);
      expect(download.suggestedFilename()).toBe('data.csv');
      expect(await readFile((await download.path())!, 'utf8')).toBe('a,b\n1,2\n');

      // The health page: /health gives its details only with the token, which the console sends.
      await page.goto(`${r.base}/ui#/health`);
      await expect.poll(() => page.locator('#health-status').textContent()).toBe('healthy');
      await expect.poll(() => page.locator('#engine').textContent()).toContain(r.svc.config.sandbox_engine === 'auto' ? '' : r.svc.config.sandbox_engine);
      expect(problems).toEqual([]);
    });
  });
});
