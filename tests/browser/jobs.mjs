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
import { launch, recordErrors, openFromActivity, checkNoErrors, failed } from './page.mjs';

const [url, session, token, running] = process.argv.slice(2);
if (!url || !session || !token || !running) {
  console.error('usage: node jobs.mjs URL SESSION_ID ADMIN_TOKEN RUNNING_JOB_ID');
  process.exit(2);
}

let step = 'launching headless Chromium';
let browser, page;
try {
  const launched = await launch();
  ({ browser, page } = launched);

  step = 'opening the page';
  await page.goto(url);
  await recordErrors(page);

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
  await page.getByLabel(/As a Job/).check();
  await page.getByLabel('Units of model', { exact: true }).fill('1');
  await page.getByRole('button', { name: 'Start in this session' }).click();

  step = 'seeing it wait at place 1 in line';
  await page.locator('#execution-title[data-state="queued"]').waitFor();
  await page.locator('#job-position', { hasText: 'place 1 in line' }).waitFor();
  const queued = (await page.locator('#execution-title').textContent()).split(' ')[0];

  step = 'seeing it listed under model in the queue';
  await model.locator('li', { hasText: queued }).waitFor();

  step = `opening the running Job ${running} and cancelling it`;
  await openFromActivity(page, running);
  await page.locator('#execution-title[data-state="running"]').waitFor();
  await page.locator('[data-control="cancel"]').click();
  await page.locator('#execution-title[data-state="cancelled"]').waitFor();

  step = 'seeing the queued Job complete';
  await openFromActivity(page, queued);
  await page.locator('#execution-title[data-state="completed"]').waitFor();

  step = 'seeing the queue empty';
  await model.locator('[data-queued]', { hasText: '0' }).waitFor();
  await model.locator('[data-in-use]', { hasText: '0' }).waitFor();

  step = 'checking what the page showed on the way';
  await checkNoErrors(page, launched.scriptErrors);
  console.log(`jobs.mjs: ${queued} waited at place 1 behind ${running}, ran once it was cancelled, and completed`);
} catch (error) {
  await failed('jobs.mjs', step, error, page);
} finally {
  await browser?.close().catch(() => {});
}
