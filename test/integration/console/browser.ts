/**
 * Headless Chromium for the console tests: Debian's `chromium` package (installed with the sandbox
 * packages from .ci/apt-packages.txt by `make system-deps` and CI), driven by playwright-core. No
 * browser is ever downloaded. Where it is missing the suite skips visibly, except in CI (`CI=true`),
 * where a missing browser is a failure.
 */
import { existsSync } from 'node:fs';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { describe, expect, it } from 'vitest';

/** The browser binary (SANDPOD_CHROMIUM overrides). */
export const CHROMIUM = process.env.SANDPOD_CHROMIUM ?? '/usr/bin/chromium';

/** `describe` that runs `body` only where Chromium is installed. */
export function describeWithChromium(title: string, body: () => void): void {
  const installed = existsSync(CHROMIUM);
  if (!installed && process.env.CI === 'true') {
    describe(title, () => {
      it('chromium is installed (CI installs it from .ci/apt-packages.txt)', () => {
        expect(installed, `${CHROMIUM} is missing`).toBe(true);
      });
    });
    return;
  }
  describe.skipIf(!installed)(`${title} (chromium ${installed ? 'present' : 'NOT INSTALLED: skipped'})`, body);
}

/** Launches headless Chromium. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, headless: true });
}

/** A page that records script errors and CSP violations (Chromium reports both on the console). */
export async function watchedPage(context: BrowserContext): Promise<{ page: Page; problems: string[] }> {
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => {
    const text = msg.text();
    // Failed loads the page expects are logged by Chromium too: 401s before the token is given, and the
    // event stream's 404 on a service without it (the page then polls). Any other error is a problem.
    const expected = /status of 401/.test(text) || (/status of 404/.test(text) && msg.location().url.endsWith('/events'));
    if (msg.type() === 'error' && !expected) problems.push(`console: ${text} (${msg.location().url})`);
    if (/Content Security Policy/i.test(text)) problems.push(`csp: ${text}`);
  });
  return { page, problems };
}
