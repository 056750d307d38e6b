// C-1, W-6 in a real browser: a person opens a session whose turn asks a structured
// question; the transcript shows the turn's tool call and the open question; the question is
// a card under Decisions. A draft survives a reload; an answer missing a required item is
// refused by the server with the item named beside it; a question that arrives while the
// person types elsewhere never takes the focus; Skip declines a whole request; the right
// answer completes the turn, and the transcript reads it answered.
//
//   node tests/browser/decide.mjs URL SESSION_ID SESSION_TOKEN EXECUTION_ID
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded by
// Playwright's timeouts: no fixed sleeps. With SCREENSHOTS=DIR, saves decision.png there.
import { launch, failed, recordErrors } from './page.mjs';

const [url, session, token, execution] = process.argv.slice(2);
if (!url || !session || !token || !execution) {
  console.error('usage: node decide.mjs URL SESSION_ID SESSION_TOKEN EXECUTION_ID');
  process.exit(2);
}

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
const card = (wait) => page.locator(`form.decision[data-decision="${wait}"]`);
try {
  ({ browser, page, scriptErrors } = await launch());

  step = 'opening the session';
  await page.goto(url);
  await page.getByLabel('Token', { exact: true }).fill(token);
  await page.getByLabel('Session id', { exact: true }).fill(session);
  await page.getByRole('button', { name: 'Open session' }).click();

  step = 'reading the transcript';
  await page.locator(`#transcript article[data-role="assistant"] [data-block="tool_call"]`).first().waitFor();
  const call = await page.locator('#transcript [data-block="tool_call"]').first().textContent();
  if (!call.includes('echo') || !call.includes('confirmed')) throw new Error(`the tool call reads "${call}"`);
  const waitBlock = page.locator('#transcript [data-block="wait"][data-wait-state="open"]').first();
  const wait = await waitBlock.getAttribute('data-wait-block');

  step = 'drafting an answer and reloading';
  const form = card(wait);
  await form.waitFor();
  await form.getByRole('spinbutton').fill('3');
  await form.locator('[data-item="note"]').fill('after lunch');
  await page.reload();
  await card(wait).waitFor();
  const kept = await card(wait).locator('[data-item="note"]').inputValue();
  const replicas = await card(wait).getByRole('spinbutton').inputValue();
  if (kept !== 'after lunch' || replicas !== '3') throw new Error(`the draft read "${kept}", "${replicas}" after a reload`);
  await recordErrors(page);
  if (process.env.SCREENSHOTS) await card(wait).screenshot({ path: `${process.env.SCREENSHOTS}/decision.png` });

  step = 'submitting without the required environment';
  await card(wait).getByRole('button', { name: 'Submit' }).click();
  const envError = card(wait).locator('[data-error="env"]');
  await page.waitForFunction((w) => document.querySelector(`form[data-decision="${w}"] [data-error="env"]`)?.textContent, wait);
  const said = await envError.textContent();
  if (!said.includes('required')) throw new Error(`the env field says "${said}"`);

  step = 'a second question arriving while the person types in the composer';
  const message = page.getByLabel('Message', { exact: true });
  await message.fill('typing here');
  await message.focus();
  const second = await page.evaluate(async ([sid, tok]) => {
    const response = await fetch(`/v1/sessions/${sid}/executions`, {
      method: 'POST', headers: { Authorization: 'Bearer ' + tok, 'Content-Type': 'application/json' },
      body: JSON.stringify({ kind: 'agent', message: 'second', script: [{ question: 'Skip me?', items: [{ id: 'why', type: 'text' }] }, { reply: 'skipped' }] }),
    });
    return (await response.json()).execution_id;
  }, [session, token]);
  await page.locator(`form.decision[data-eid="${second}"]`).waitFor();
  const focused = await page.evaluate(() => [document.activeElement?.id, document.getElementById('message').value]);
  if (focused[0] !== 'message' || focused[1] !== 'typing here') throw new Error(`the focus moved to ${focused[0]} ("${focused[1]}")`);

  step = 'skipping the second question';
  await page.locator(`form.decision[data-eid="${second}"]`).getByRole('button', { name: 'Skip' }).click();
  await page.locator(`form.decision[data-eid="${second}"]`).waitFor({ state: 'detached' });

  step = 'answering the first question';
  await card(wait).getByLabel('prod').check();
  await card(wait).getByLabel('test').check();
  await card(wait).getByRole('button', { name: 'Submit' }).click();
  await card(wait).waitFor({ state: 'detached' });
  await page.locator(`#transcript [data-wait-block="${wait}"][data-wait-state="answered"]`).waitFor();
  await page.locator(`#transcript article[data-role="assistant"]`, { hasText: 'deployed' }).waitFor();

  step = 'checking what the page showed on the way';
  const seen = await page.evaluate(() => window.seen);
  if (seen.errors.length) throw new Error(`the page showed an error: ${seen.errors[0]}`);
  if (scriptErrors.length) throw new Error(`the page's script failed: ${scriptErrors[0]}`);
  console.log(`decide.mjs: ${wait} answered after a refused answer and a reload; ${second} skipped; focus kept`);
} catch (error) {
  await failed('decide.mjs', step, error, page);
} finally {
  await browser?.close().catch(() => {});
}
