// J-1 in a real browser: an operator with the admin token sees the resource queue (model:
// 1 of 1 in use by a Job that runs), starts a Job from the page, sees it wait at place 1 in
// line and listed under the resource, cancels the running Job from the page, and sees the
// queued one run to completion and the queue empty, with no error shown on the way.
//
//   node tests/browser/jobs.mjs URL SESSION_ID ADMIN_TOKEN RUNNING_JOB_ID
//   (CHROMIUM overrides /usr/bin/chromium)
//
// Run by tests/it/browser.rs against a real `openprogram serve --resource model=1`. Exit 0
// on success; on failure exit 1 with one line saying which step failed. Every wait is
// bounded by Playwright's timeouts: no fixed sleeps.
import { chromium } from 'playwright-core';

const [url, session, token, running] = process.argv.slice(2);
if (!url || !session || !token || !running) {
  console.error('usage: node jobs.mjs URL SESSION_ID ADMIN_TOKEN RUNNING_JOB_ID');
  process.exit(2);
}

const TIMEOUT_MS = 60_000;
let step = 'launching headless Chromium';
let browser, page;
try {
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox'],
    headless: true,
    timeout: TIMEOUT_MS,
  });
  page = await browser.newPage();
  page.setDefaultTimeout(TIMEOUT_MS);
  const scriptErrors = [];
  page.on('pageerror', (error) => scriptErrors.push(error.message));

  step = 'opening the page';
  await page.goto(url);
  await page.evaluate(() => {
    window.seen = { errors: [] };
    new MutationObserver(() => {
      const error = document.getElementById('error')?.textContent;
      if (error) window.seen.errors.push(error);
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });

  step = 'entering the admin token and the session id';
  await page.getByLabel('Token', { exact: true }).fill(token);
  await page.getByRole('button', { name: 'Use token' }).click();
  await page.getByLabel('Session id', { exact: true }).fill(session);
  await page.getByRole('button', { name: 'Open session' }).click();

  step = 'reading the queue: the running Job holds model';
  const model = page.locator('#queue [data-resource="model"]');
  await model.locator('[data-in-use]', { hasText: '1' }).waitFor();

  step = 'starting a Job from the page';
  await page.getByLabel('Script', { exact: true }).fill('[{"reply":"queued and done"}]');
  await page.getByLabel(/As a Job/).fill('{"model": 1}');
  await page.getByRole('button', { name: 'Start in this session' }).click();

  step = 'seeing it wait at place 1 in line';
  await page.locator('#execution-title[data-state="queued"]').waitFor();
  await page.locator('#job-position', { hasText: 'place 1 in line' }).waitFor();
  const queued = (await page.locator('#execution-title').textContent()).split(' ')[0];

  step = 'seeing it listed under model in the queue';
  await model.locator('li', { hasText: queued }).waitFor();

  step = `opening the running Job ${running} and cancelling it`;
  const button = page.locator(`button.exec[data-eid="${running}"]`).first();
  await button.waitFor({ state: 'attached' });
  const branch = page.locator('#activity details', { has: button }).first();
  if (!(await branch.evaluate((details) => details.open))) await branch.locator('summary').click();
  await button.click();
  await page.locator('#execution-title[data-state="running"]').waitFor();
  await page.locator('[data-control="cancel"]').click();
  await page.locator('#execution-title[data-state="cancelled"]').waitFor();

  step = 'seeing the queued Job complete';
  const mine = page.locator(`button.exec[data-eid="${queued}"]`).first();
  await mine.waitFor({ state: 'attached' });
  const its = page.locator('#activity details', { has: mine }).first();
  if (!(await its.evaluate((details) => details.open))) await its.locator('summary').click();
  await mine.click();
  await page.locator('#execution-title[data-state="completed"]').waitFor();

  step = 'seeing the queue empty';
  await model.locator('[data-queued]', { hasText: '0' }).waitFor();
  await model.locator('[data-in-use]', { hasText: '0' }).waitFor();

  step = 'checking what the page showed on the way';
  const seen = await page.evaluate(() => window.seen);
  if (seen.errors.length) throw new Error(`the page showed an error: ${seen.errors[0]}`);
  if (scriptErrors.length) throw new Error(`the page's script failed: ${scriptErrors[0]}`);
  console.log(`jobs.mjs: ${queued} waited at place 1 behind ${running}, ran once it was cancelled, and completed`);
} catch (error) {
  const shown = await page?.locator('#error').textContent({ timeout: 1000 }).catch(() => '');
  console.error(`jobs.mjs: failed while ${step}: ${String(error?.message ?? error).split('\n')[0]}` +
    (shown ? ` (the page says: ${shown})` : ''));
  process.exitCode = 1;
} finally {
  await browser?.close().catch(() => {});
}
