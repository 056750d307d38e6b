// F-3, K-7 in a real browser: a person opens the page, enters a session's token and id,
// opens a durable function's execution paused on a version conflict, sees the differences,
// chooses to keep the original code and continue, and sees the execution complete under
// `keep_original`, with no error shown on the way.
//
//   node tests/browser/resolve.mjs URL SESSION_ID SESSION_TOKEN EXECUTION_ID
//   (CHROMIUM overrides /usr/bin/chromium)
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded by
// Playwright's timeouts: no fixed sleeps.
import { chromium } from 'playwright-core';

const [url, session, token, execution] = process.argv.slice(2);
if (!url || !session || !token || !execution) {
  console.error('usage: node resolve.mjs URL SESSION_ID SESSION_TOKEN EXECUTION_ID');
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

  step = 'entering the session token and id';
  await page.getByLabel('Token', { exact: true }).fill(token);
  await page.getByLabel('Session id', { exact: true }).fill(session);
  await page.getByRole('button', { name: 'Open session' }).click();

  step = `opening execution ${execution} from the activity`;
  const button = page.locator(`button.exec[data-eid="${execution}"]`).first();
  await button.waitFor({ state: 'attached' });
  const branch = page.locator('#activity details', { has: button }).first();
  if (!(await branch.evaluate((details) => details.open))) await branch.locator('summary').click();
  await button.click();

  step = 'reading the version conflict';
  await page.locator('#execution-title[data-state="paused"]').waitFor();
  const differences = page.locator('#differences li');
  await differences.first().waitFor();
  const shown = await differences.allTextContents();
  if (!shown.some((text) => text.includes('not accounted for'))) throw new Error(`differences: ${shown.join(' | ')}`);

  step = 'keeping the original code and continuing';
  await page.getByRole('button', { name: 'Keep the original code and continue' }).click();

  step = 'waiting for the execution to complete';
  await page.locator('#execution-title[data-state="completed"]').waitFor();
  const policy = await page.locator('#function-policy').textContent();
  if (policy !== 'keep_original') throw new Error(`the policy reads ${policy}`);

  step = 'checking what the page showed on the way';
  const seen = await page.evaluate(() => window.seen);
  if (seen.errors.length) throw new Error(`the page showed an error: ${seen.errors[0]}`);
  if (scriptErrors.length) throw new Error(`the page's script failed: ${scriptErrors[0]}`);
  console.log(`resolve.mjs: resolved ${execution}: ${shown.length} differences shown; completed under keep_original`);
} catch (error) {
  const shown = await page?.locator('#error').textContent({ timeout: 1000 }).catch(() => '');
  console.error(`resolve.mjs: failed while ${step}: ${String(error?.message ?? error).split('\n')[0]}` +
    (shown ? ` (the page says: ${shown})` : ''));
  process.exitCode = 1;
} finally {
  await browser?.close().catch(() => {});
}
