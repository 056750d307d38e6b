// E-8 in a real browser: a person sends a message from the composer, then "continue" with
// the composer's default (continue the conversation). The second turn answers the first's
// reply, the transcript says its model sees one earlier turn, and the second turn's reply —
// the scripted provider's digest of what its request carried — holds the first turn.
//
//   node tests/browser/converse.mjs URL SESSION_ID SESSION_TOKEN
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded by
// Playwright's timeouts: no fixed sleeps.
import { launch, failed, recordErrors, checkNoErrors, openSession } from './page.mjs';

const [url, session, token] = process.argv.slice(2);
if (!url || !session || !token) {
  console.error('usage: node converse.mjs URL SESSION_ID SESSION_TOKEN');
  process.exit(2);
}

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
const replies = () => page.locator('#transcript article[data-role="assistant"]');
try {
  ({ browser, page, scriptErrors } = await launch());

  step = 'opening the session';
  await page.goto(url);
  await recordErrors(page);
  await openSession(page, token, session);
  await page.locator('#transcript', { hasText: 'no messages yet' }).waitFor();

  step = 'sending the first message';
  await page.getByLabel('Message', { exact: true }).fill('Find the largest file');
  await page.getByLabel('Script', { exact: true }).fill('[{"tool":"echo","args":{"text":"a.log"}},{"reply":"a.log is the largest."}]');
  await page.getByRole('button', { name: 'Start in this session' }).click();
  await replies().filter({ hasText: 'a.log is the largest.' }).waitFor();

  step = 'sending "continue" on the same conversation';
  const continuing = page.getByLabel(/Continue the conversation/);
  if (!(await continuing.isChecked())) throw new Error('the composer does not continue the conversation by default');
  await page.getByLabel('Message', { exact: true }).fill('continue');
  await page.getByLabel('Script', { exact: true }).fill('[{"digest":true}]');
  await page.getByRole('button', { name: 'Start in this session' }).click();
  await replies().filter({ hasText: 'user: continue' }).waitFor();

  step = 'reading what the second turn saw';
  const seen = await replies().filter({ hasText: 'user: continue' }).textContent();
  for (const line of ['user: Find the largest file', 'tool call00001: a.log', 'assistant: a.log is the largest.']) {
    if (!seen.includes(line)) throw new Error(`the second turn did not see "${line}": ${seen}`);
  }
  const label = await page.locator('#transcript article[data-role="user"]', { hasText: 'continue' })
    .locator('[data-context]').textContent();
  if (!label.includes('sees 1 earlier turn')) throw new Error(`the second message says "${label}"`);
  await checkNoErrors(page, scriptErrors);
  console.log('converse.mjs: the second turn saw the first');
} catch (error) {
  await failed('converse.mjs', step, error, page);
} finally {
  await browser?.close();
}
