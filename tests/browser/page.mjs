// What the page's browser scripts share: a headless Chromium on the page, a record of every
// error text the page shows, opening a session with its token, opening an execution from the
// session's Activity, the check that the page fits a phone, and the one line a script ends
// with when it fails.
import { chromium } from 'playwright-core';

// A liveness bound, not a timing goal: CI runs these beside the whole suite on 2 cores,
// where a headless Chromium can be starved for many seconds (seen at 20 s).
export const TIMEOUT_MS = 60_000;

// Headless Chromium (CHROMIUM overrides /usr/bin/chromium) on a new page; `scriptErrors`
// collects what the page's own script throws.
export async function launch() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox'],
    headless: true,
    timeout: TIMEOUT_MS,
  });
  const page = await browser.newPage();
  page.setDefaultTimeout(TIMEOUT_MS);
  const scriptErrors = [];
  page.on('pageerror', (error) => scriptErrors.push(error.message));
  return { browser, page, scriptErrors };
}

// Records every error text the page shows, however briefly (`window.seen.errors`).
export async function recordErrors(page) {
  await page.evaluate(() => {
    window.seen = { errors: [] };
    new MutationObserver(() => {
      const error = document.getElementById('error')?.textContent;
      if (error) window.seen.errors.push(error);
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
}

// Opens `execution` from the Activity: its branch expanded if need be, then its button.
export async function openFromActivity(page, execution) {
  const button = page.locator(`button.exec[data-eid="${execution}"]`).first();
  await button.waitFor({ state: 'attached' });
  const branch = page.locator('#activity details', { has: button }).first();
  if (!(await branch.evaluate((details) => details.open))) await branch.locator('summary').click();
  await button.click();
}

// Throws if the page showed an error or its script failed on the way.
export async function checkNoErrors(page, scriptErrors) {
  const seen = await page.evaluate(() => window.seen);
  if (seen.errors.length) throw new Error(`the page showed an error: ${seen.errors[0]}`);
  if (scriptErrors.length) throw new Error(`the page's script failed: ${scriptErrors[0]}`);
}

// The one line a failed script prints (with what the page says), and exit status 1.
export async function failed(script, step, error, page) {
  const shown = await page?.locator('#error').textContent({ timeout: 1000 }).catch(() => '');
  console.error(`${script}: failed while ${step}: ${String(error?.message ?? error).split('\n')[0]}` +
    (shown ? ` (the page says: ${shown})` : ''));
  process.exitCode = 1;
}

// Enters `token` and `session` and opens that session.
export async function openSession(page, token, session) {
  await page.getByLabel('Token', { exact: true }).fill(token);
  await page.getByLabel('Session id', { exact: true }).fill(session);
  await page.getByRole('button', { name: 'Open session' }).click();
}

// Throws unless the page fits a phone's width (390 px) without scrolling sideways.
export async function fitsAPhone(page) {
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 1) throw new Error(`the page is ${overflow} px wider than a phone`);
}
