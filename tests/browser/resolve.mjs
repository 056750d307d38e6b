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
import { launch, recordErrors, openFromActivity, checkNoErrors, failed, openSession } from './page.mjs';

const [url, session, token, execution] = process.argv.slice(2);
if (!url || !session || !token || !execution) {
  console.error('usage: node resolve.mjs URL SESSION_ID SESSION_TOKEN EXECUTION_ID');
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

  step = 'entering the session token and id';
  await openSession(page, token, session);

  step = `opening execution ${execution} from the activity`;
  await openFromActivity(page, execution);

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
  await checkNoErrors(page, launched.scriptErrors);
  console.log(`resolve.mjs: resolved ${execution}: ${shown.length} differences shown; completed under keep_original`);
} catch (error) {
  await failed('resolve.mjs', step, error, page);
} finally {
  await browser?.close().catch(() => {});
}
