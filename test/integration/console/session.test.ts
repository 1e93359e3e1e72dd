/**
 * The console's session view in a real browser (headless Chromium via playwright-core) against a real
 * listening service and sandbox: start a session from the list, run cells from the box, see a cell's
 * output while it runs, the cells in order with their code, output and errors (also after a reload,
 * from the replayed event stream), close the session, find it in the list. No script errors or CSP
 * violations on the way.
 */
import type { AddressInfo } from 'node:net';
import type { ServerType } from '@hono/node-server';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { listen, startTestService, type TestService } from '../../support/service.ts';
import { describeWithChromium, launchChromium, watchedPage } from './browser.ts';

const asRoot = process.getuid?.() === 0;

describeWithChromium('the console: a session view', () => {
  let browser: Browser;
  let svc: TestService;
  let server: ServerType;
  let base: string;
  beforeAll(async () => {
    svc = await startTestService({ max_sessions: 2, warm_pool: { sizes: {} } });
    server = await listen(svc, 0, '127.0.0.1');
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    browser = await launchChromium();
  }, 120_000);
  afterAll(async () => {
    await browser?.close();
    (server as { closeAllConnections?: () => void } | undefined)?.closeAllConnections?.();
    await new Promise((r) => server?.close(r));
    await svc?.close();
  });

  const runCell = async (page: Page, code: string) => {
    const editor = page.locator('.next-cell .cm-content');
    await editor.click();
    await page.keyboard.insertText(code);
    await page.getByRole('button', { name: 'Run cell' }).click();
  };
  const cell = (page: Page, n: number) => page.locator(`.cell[data-cell="${n}"]`);

  it.skipIf(!asRoot)('starts a session, runs cells with live output, shows them in order, closes it', async () => {
    const context = await browser.newContext();
    const { page, problems } = await watchedPage(context);
    await page.goto(`${base}/ui#/sessions`);
    await page.getByRole('button', { name: 'New session' }).click();
    await page.waitForURL(/#\/sessions\/[0-9a-f-]{36}$/);
    const id = /#\/sessions\/(.+)$/.exec(page.url())![1]!;
    await expect.poll(() => page.locator('.next-cell h2').innerText()).toBe('Cell 1');

    await runCell(page, 'x = 41\nprint("first", x)');
    await expect.poll(() => cell(page, 1).getAttribute('data-status'), { timeout: 30_000 }).toBe('succeeded');
    expect(await cell(page, 1).locator('.cell-output').innerText()).toBe('first 41\n');
    // The box is emptied for the next cell.
    await expect.poll(() => page.locator('.next-cell h2').innerText()).toBe('Cell 2');
    expect((await page.locator('.next-cell .cm-content').innerText()).trim()).toBe('');

    // A cell's output shows while it runs: it waits for a file that the test writes after seeing "tick".
    await runCell(page, 'import os, time\nprint("tick", flush=True)\nwhile not os.path.exists("go"): time.sleep(0.05)\nprint("done", x + 1)');
    await expect.poll(() => cell(page, 2).locator('.cell-output').innerText(), { timeout: 30_000 }).toBe('tick\n');
    expect(await cell(page, 2).getAttribute('data-status')).toBe('running');
    const put = await svc.app.request(`/sessions/${id}/files/go`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: '1' });
    expect(put.status).toBe(201);
    await expect.poll(() => cell(page, 2).getAttribute('data-status'), { timeout: 30_000 }).toBe('succeeded');
    expect(await cell(page, 2).locator('.cell-output').innerText()).toBe('tick\ndone 42\n');

    await runCell(page, 'import sys\nprint("to stderr", file=sys.stderr)\n1/0');
    await expect.poll(() => cell(page, 3).getAttribute('data-status'), { timeout: 30_000 }).toBe('failed');
    expect(await cell(page, 3).locator('.cell-error').innerText()).toContain('division_error');
    expect(await cell(page, 3).locator('.cell-output .stderr').first().innerText()).toContain('to stderr');

    // A reload shows the same cells, in order, each with its code, from the replayed stream.
    await page.reload();
    await expect.poll(() => page.locator('.cell').count(), { timeout: 30_000 }).toBe(3);
    expect(await page.locator('.cell').evaluateAll((els) => els.map((e) => e.getAttribute('data-cell')))).toEqual(['1', '2', '3']);
    await expect.poll(() => cell(page, 1).locator('.cell-code').innerText()).toBe('x = 41\nprint("first", x)');
    expect(await cell(page, 2).locator('.cell-output').innerText()).toBe('tick\ndone 42\n');

    await page.getByRole('button', { name: 'Close session' }).click();
    await expect.poll(() => page.locator('#end-reason').innerText().catch(() => ''), { timeout: 15_000 }).toBe('ended: closed');
    expect(await page.locator('.next-cell').count()).toBe(0);

    await page.goto(`${base}/ui#/sessions`);
    const row = page.locator(`tr[data-session="${id}"]`);
    await expect.poll(() => row.innerText().catch(() => ''), { timeout: 15_000 }).toMatch(/ended\s+closed/);
    expect(await row.locator('td').nth(3).innerText()).toBe('3');
    expect(problems).toEqual([]);
    await context.close();
  }, 180_000);
});
