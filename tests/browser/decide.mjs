// C-1, W-6 and the product document's decision panels in a real browser: a person opens a
// session whose turn asks a form of four questions; the transcript shows the turn's tool call
// and the open question; the form is a panel under Decisions with a header, one question at a
// time, Back and Next, and Submit on the last. Drafts survive navigation, a collapse and a
// reload (which returns to the same question); an answer missing a required item is refused by
// the server and the panel shows that question with the item named; a question that arrives
// while the person types elsewhere never takes the focus; Skip declines a whole request; a
// visit to another session keeps the draft; an answer whose delivery is not confirmed (the
// network drops it) says so and is sent again under the same command id; the submitted
// answer is shown before the stream confirms it; the turn completes and the transcript reads
// it answered.
//
//   node tests/browser/decide.mjs URL SESSION_ID SESSION_TOKEN EXECUTION_ID OTHER_SESSION_ID OTHER_TOKEN
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded by
// Playwright's timeouts: no fixed sleeps. With SCREENSHOTS=DIR, saves decision.png there.
import { launch, failed, recordErrors, openSession, fitsAPhone } from './page.mjs';

const [url, session, token, execution, otherSession, otherToken] = process.argv.slice(2);
if (!url || !session || !token || !execution || !otherSession || !otherToken) {
  console.error('usage: node decide.mjs URL SESSION_ID SESSION_TOKEN EXECUTION_ID OTHER_SESSION_ID OTHER_TOKEN');
  process.exit(2);
}

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
const card = (wait) => page.locator(`form.decision[data-decision="${wait}"]`);
try {
  ({ browser, page, scriptErrors } = await launch());

  step = 'opening the session';
  await page.goto(url);
  await openSession(page, token, session);

  step = 'reading the transcript';
  await page.locator(`#transcript article[data-role="assistant"] [data-block="tool_call"]`).first().waitFor();
  const call = await page.locator('#transcript [data-block="tool_call"]').first().textContent();
  if (!call.includes('echo') || !call.includes('confirmed')) throw new Error(`the tool call reads "${call}"`);
  const waitBlock = page.locator('#transcript [data-block="wait"][data-wait-state="open"]').first();
  const wait = await waitBlock.getAttribute('data-wait-block');

  step = 'reading the panel: its header and the first of four questions';
  const form = card(wait);
  await form.waitFor();
  const header = await form.locator('header').textContent();
  if (!header.includes('Deploy where?') || !header.includes('asked by')) throw new Error(`the header reads "${header}"`);
  const counter = () => form.locator('[data-counter]').textContent();
  if ((await counter()) !== 'question 1 of 4') throw new Error(`the counter reads "${await counter()}"`);
  const visible = () => form.locator('fieldset[data-field]:visible').getAttribute('data-field');
  if ((await visible()) !== 'env' || await form.getByRole('button', { name: 'Submit' }).isVisible()) throw new Error('the form does not start at its first question alone');

  step = 'the transcript beside the panels on a wide screen, above them on a narrow one';
  const box = (id) => page.locator(id).boundingBox();
  await page.setViewportSize({ width: 1600, height: 900 });
  let [talk, side] = [await box('#transcript'), await box('#decisions')];
  if (!(talk.x + talk.width <= side.x && side.y < talk.y + talk.height)) throw new Error(`not side by side: ${JSON.stringify([talk, side])}`);
  await page.setViewportSize({ width: 1280, height: 900 });
  [talk, side] = [await box('#transcript'), await box('#decisions')];
  if (!(side.y >= talk.y + talk.height)) throw new Error(`not stacked: ${JSON.stringify([talk, side])}`);

  step = 'drafting with Next and Back, collapsing, and reloading';
  await form.getByRole('button', { name: 'Next' }).click();
  await form.getByRole('button', { name: 'Next' }).click();
  if ((await visible()) !== 'replicas') throw new Error(`Next led to ${await visible()}`);
  await form.getByRole('spinbutton').fill('3');
  await form.getByRole('button', { name: 'Next' }).click();
  await form.locator('[data-item="note"]').fill('after lunch');
  await form.getByRole('button', { name: 'Back' }).click();
  if ((await form.getByRole('spinbutton').inputValue()) !== '3') throw new Error('Back lost the draft');
  await form.getByRole('button', { name: 'Next' }).click();
  await form.getByRole('button', { name: 'Collapse' }).click();
  if (await form.locator('.decision-body').isVisible()) throw new Error('the panel did not collapse');
  await card(wait).getByRole('button', { name: 'Expand' }).click();
  await page.reload();
  await card(wait).waitFor();
  if ((await card(wait).locator('[data-counter]').textContent()) !== 'question 4 of 4') throw new Error('a reload did not return to the same question');
  const kept = await card(wait).locator('[data-item="note"]').inputValue();
  await card(wait).getByRole('button', { name: 'Back' }).click();
  const replicas = await card(wait).getByRole('spinbutton').inputValue();
  if (kept !== 'after lunch' || replicas !== '3') throw new Error(`the draft read "${kept}", "${replicas}" after a reload`);
  await card(wait).getByRole('button', { name: 'Next' }).click();
  await recordErrors(page);
  await page.evaluate(() => {
    window.seen.submitted = [];
    new MutationObserver(() => {
      for (const shown of document.querySelectorAll('[data-submitted]')) window.seen.submitted.push(shown.textContent.replace(/\s+/g, ' '));
    }).observe(document.getElementById('decisions'), { subtree: true, childList: true, characterData: true });
  });
  if (process.env.SCREENSHOTS) await card(wait).screenshot({ path: `${process.env.SCREENSHOTS}/decision.png` });

  step = 'submitting without the required environment';
  await card(wait).getByRole('button', { name: 'Submit' }).click();
  const envError = card(wait).locator('[data-error="env"]');
  await page.waitForFunction((w) => document.querySelector(`form[data-decision="${w}"] [data-error="env"]`)?.textContent, wait);
  const said = await envError.textContent();
  if (!said.includes('required')) throw new Error(`the env field says "${said}"`);
  if ((await card(wait).locator('fieldset[data-field]:visible').getAttribute('data-field')) !== 'env') throw new Error('the refused question is not the one shown');

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

  step = 'opening another session and coming back: the draft is kept';
  await openSession(page, otherToken, otherSession);
  await page.locator('#decisions', { hasText: 'none pending' }).waitFor();
  await openSession(page, token, session);
  await card(wait).waitFor();
  if ((await card(wait).locator('[data-item="note"]').inputValue()) !== 'after lunch') throw new Error('switching sessions lost the draft');

  step = 'answering while no answer comes back: sent again under the same command id';
  const sent = [];
  page.on('request', (request) => {
    if (request.method() === 'POST' && request.url().endsWith(`/executions/${execution}/commands`)) sent.push(JSON.parse(request.postData()).command_id);
  });
  await page.route(`**/executions/${execution}/commands`, (route) => route.abort('connectionreset'));
  await card(wait).getByLabel('prod').check();
  await card(wait).getByRole('button', { name: 'Next' }).click();
  await card(wait).getByLabel('test').check();
  await card(wait).getByRole('button', { name: 'Next' }).click();
  await card(wait).getByRole('button', { name: 'Next' }).click();
  await card(wait).getByRole('button', { name: 'Submit' }).click();
  await card(wait).locator('[data-delivery="unconfirmed"]').waitFor();
  await page.unroute(`**/executions/${execution}/commands`);
  await card(wait).getByRole('button', { name: 'Send again' }).click();
  await card(wait).waitFor({ state: 'detached' });
  if (sent.length < 2 || new Set(sent).size !== 1) throw new Error(`the answer went out under ${new Set(sent).size} command ids in ${sent.length} tries`);
  const shown = await page.evaluate(() => window.seen.submitted);
  const answer = 'Environment: prod · Checks: test · Replicas: 3 · Note: after lunch';
  if (!shown.some((text) => text.includes(answer))) throw new Error(`the submitted answer was never shown: ${shown.slice(-3).join(' | ')}`);
  await page.locator(`#transcript [data-wait-block="${wait}"][data-wait-state="answered"]`).waitFor();
  await page.locator(`#transcript article[data-role="assistant"]`, { hasText: 'deployed' }).waitFor();

  step = 'reading it on a phone';
  await fitsAPhone(page);

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
