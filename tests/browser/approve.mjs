// B-3, B-6, W-1 in a real browser: a person opens the page, enters a session's token and
// id, finds the execution waiting for approval under Needs attention, approves it, sees the
// wait read `submitted` at once, sees the execution complete and the History count go from
// N to N+1, and never sees an error while the page loads or follows the session.
//
//   node tests/browser/approve.mjs URL SESSION_ID SESSION_TOKEN
//   (or OP_URL, OP_SESSION, OP_TOKEN; CHROMIUM overrides /usr/bin/chromium)
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded by
// Playwright's timeouts: no fixed sleeps.
import { launch, failed, openSession } from './page.mjs';

const [url, session, token] = [
  process.argv[2] ?? process.env.OP_URL,
  process.argv[3] ?? process.env.OP_SESSION,
  process.argv[4] ?? process.env.OP_TOKEN,
];
if (!url || !session || !token) {
  console.error('usage: node approve.mjs URL SESSION_ID SESSION_TOKEN (or env OP_URL, OP_SESSION, OP_TOKEN)');
  process.exit(2);
}

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
try {
  ({ browser, page, scriptErrors } = await launch());

  step = 'opening the page';
  await page.goto(url);
  // Record every error text the page shows and every status a wait goes through, however
  // briefly: the page re-renders as events arrive.
  await page.evaluate(() => {
    window.seen = { errors: [], waits: [] };
    const record = () => {
      const error = document.getElementById('error')?.textContent;
      if (error) window.seen.errors.push(error);
      for (const cell of document.querySelectorAll('[data-wait-status]')) {
        if (window.seen.waits.at(-1) !== cell.dataset.waitStatus) window.seen.waits.push(cell.dataset.waitStatus);
      }
    };
    new MutationObserver(record).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  });

  step = 'entering the session token and id';
  await openSession(page, token, session);

  step = 'reading the History count';
  const history = page.locator('#history-count');
  const before = Number(await history.textContent());
  if (!Number.isInteger(before)) throw new Error(`History count is not a number: ${await history.textContent()}`);

  step = 'finding the execution waiting for approval under Needs attention';
  const branch = page.locator('#needs-attention details', { hasText: 'Waiting for your response' }).first();
  if (!(await branch.evaluate((details) => details.open))) await branch.locator('summary').click();
  const execution = branch.locator('button.exec', { hasText: 'Waiting for your response' }).first();
  const executionId = await execution.getAttribute('data-eid');
  await execution.click();

  step = `approving execution ${executionId}`;
  await page.locator('#execution-title[data-state="waiting"]').waitFor();
  await page.locator('#execution').getByRole('button', { name: 'Approve' }).click();

  step = `waiting for execution ${executionId} to complete`;
  await page.locator('#execution-title[data-state="completed"]').waitFor();

  step = `waiting for the History count to go from ${before} to ${before + 1}`;
  await page.waitForFunction((expected) => document.getElementById('history-count')?.textContent === expected, String(before + 1));

  step = 'checking what the page showed on the way';
  const seen = await page.evaluate(() => window.seen);
  if (!seen.waits.includes('submitted')) throw new Error(`the wait never read submitted (it read ${seen.waits.join(' → ')})`);
  if (seen.errors.length) throw new Error(`the page showed an error: ${seen.errors[0]}`);
  if (scriptErrors.length) throw new Error(`the page's script failed: ${scriptErrors[0]}`);
  console.log(`approve.mjs: approved ${executionId}: wait ${seen.waits.join(' → ')}; completed; History ${before} → ${before + 1}`);
} catch (error) {
  await failed('approve.mjs', step, error, page);
} finally {
  await browser?.close().catch(() => {});
}
