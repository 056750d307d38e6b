// Issue 36 in a real browser: an operator enters the admin token and finds, across sessions,
// the execution that needs attention first in the Executions overview; narrows the list by
// state and by id; opens the execution from the keyboard; reads its timeline (each event's
// payload and the time since the one before, a new attempt as a separator, receipts by
// status); declines its approval from the page and sees it complete. The page stays within
// a phone's width. With SCREENSHOTS=DIR, saves overview.png and execution.png there.
//
//   node tests/browser/overview.mjs URL ADMIN_TOKEN WAITING_EXECUTION DONE_EXECUTION
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded.
import { launch, failed, recordErrors, checkNoErrors, fitsAPhone } from './page.mjs';

const [url, admin, waiting, done] = process.argv.slice(2);
if (!url || !admin || !waiting || !done) {
  console.error('usage: node overview.mjs URL ADMIN_TOKEN WAITING_EXECUTION DONE_EXECUTION');
  process.exit(2);
}
const shots = process.env.SCREENSHOTS;
const rows = (page) => page.locator('#overview tr[data-eid]');

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
try {
  ({ browser, page, scriptErrors } = await launch());
  await page.setViewportSize({ width: 1280, height: 900 });

  step = 'opening the page';
  await page.goto(url);
  await recordErrors(page);

  step = 'entering the admin token';
  await page.getByLabel('Token', { exact: true }).fill(admin);
  await page.getByRole('button', { name: 'Use token' }).click();

  step = 'finding the waiting execution first in the overview';
  await page.waitForFunction((id) => {
    const first = document.querySelector('#overview tr[data-eid]');
    return first?.dataset.eid === id && first.classList.contains('attention');
  }, waiting);
  if (shots) await page.screenshot({ path: `${shots}/overview.png` });

  step = 'filtering by state';
  await page.getByLabel('State', { exact: true }).selectOption('completed');
  await page.waitForFunction((id) => {
    const all = [...document.querySelectorAll('#overview tr[data-eid]')];
    return all.length > 0 && all.every((row) => row.dataset.state === 'completed') && all.some((row) => row.dataset.eid === id);
  }, done);
  await page.getByLabel('State', { exact: true }).selectOption('');

  step = 'scanning the rows: the words asked, a state chip, a relative time, a short id';
  const first = await page.locator(`#overview tr[data-eid="${waiting}"]`).evaluate((row) => ({
    asked: row.querySelector('button.ov-open')?.textContent ?? '', chip: row.querySelector('.chip')?.textContent ?? '',
    time: row.querySelector('time')?.textContent ?? '', exact: row.querySelector('time')?.title ?? '',
    short: row.querySelector('code')?.textContent ?? '', copy: row.querySelector('button.copy')?.dataset.copy ?? '',
  }));
  if (first.asked !== 'deploy the site') throw new Error(`the row does not say what was asked: ${first.asked}`);
  if (first.chip !== 'waiting') throw new Error(`the row's chip: ${first.chip}`);
  if (!/ago|just now/.test(first.time) || !first.exact) throw new Error(`the row's time: ${first.time} (${first.exact})`);
  if (first.copy !== waiting || first.short.length >= waiting.length) throw new Error(`the row's id: ${first.short}, copies ${first.copy}`);
  if (!(await page.locator('#ov-counts [data-count="waiting"]').textContent()).endsWith(' 1')) throw new Error('no count of waiting executions');

  step = 'reading the figures: the waiting execution among the executions not ended';
  await page.locator('#figures figure[data-figure="states"][data-waiting="1"]').waitFor();
  for (const name of ['steps', 'jobs']) await page.locator(`#figures figure[data-figure="${name}"] svg[role="img"]`).waitFor();

  step = 'reading the sessions by what they were asked';
  await page.locator('#sessions button.session', { hasText: 'deploy the site' }).waitFor();

  step = 'finding an execution by the words of its message';
  await page.getByLabel('Words of its message', { exact: true }).fill('DEPLOY the');
  await page.waitForFunction((id) => {
    const all = [...document.querySelectorAll('#overview tr[data-eid]')];
    return all.length === 1 && all[0].dataset.eid === id;
  }, waiting);
  if (!page.url().includes('text=DEPLOY')) throw new Error(`the filter is not in the address: ${page.url()}`);

  step = 'reloading a shared view';
  await page.reload();
  await recordErrors(page);
  await page.getByLabel('Token', { exact: true }).fill(admin);
  await page.getByRole('button', { name: 'Use token' }).click();
  await page.waitForFunction((id) => {
    const all = [...document.querySelectorAll('#overview tr[data-eid]')];
    return all.length === 1 && all[0].dataset.eid === id && document.getElementById('ov-text').value === 'DEPLOY the';
  }, waiting);
  await page.getByLabel('Words of its message', { exact: true }).fill('');

  step = 'searching by id';
  await page.getByLabel('Any id', { exact: true }).fill(waiting);
  await page.waitForFunction((id) => {
    const all = [...document.querySelectorAll('#overview tr[data-eid]')];
    return all.length === 1 && all[0].dataset.eid === id;
  }, waiting);

  step = 'opening the execution from the keyboard';
  const open = page.locator(`button.ov-open[data-eid="${waiting}"]`);
  await open.focus();
  await page.keyboard.press('Enter');
  await page.locator('#execution-title', { hasText: waiting }).waitFor();

  step = 'reading the timeline';
  await page.locator('#timeline tr[data-type="wait_opened"]').first().waitFor();
  const timeline = await page.evaluate(() => [...document.querySelectorAll('#timeline tr')].map((row) => ({
    type: row.dataset.type,
    attempt: row.classList.contains('attempt'),
    duration: row.querySelector('.duration')?.textContent ?? '',
    payload: row.querySelector('pre')?.textContent ?? '',
  })));
  if (timeline[0]?.type !== 'admitted') throw new Error(`the timeline starts with ${timeline[0]?.type}`);
  if (!timeline.some((row) => row.type === 'attempt_started' && row.attempt)) throw new Error('no attempt separator');
  if (!timeline.slice(1).every((row) => /^\+\d+ ms$/.test(row.duration))) throw new Error('an event without its duration');
  const asked = timeline.find((row) => row.type === 'wait_opened');
  if (!asked.payload.includes('deploy?')) throw new Error(`the wait's payload is missing: ${asked.payload}`);

  step = 'following the wait id in the timeline to its execution';
  await page.getByLabel('Any id', { exact: true }).fill('');
  await page.locator('#timeline tr[data-type="wait_opened"] a.find[data-find^="wait_"]').first().click();
  await page.waitForFunction((id) => {
    const all = [...document.querySelectorAll('#overview tr[data-eid]')];
    return document.getElementById('ov-id').value.startsWith('wait_') && all.length === 1 && all[0].dataset.eid === id;
  }, waiting);

  step = 'declining the approval from the page';
  await page.locator('[data-decline]').first().click();
  await page.locator('#execution-state', { hasText: 'completed' }).waitFor();
  step = 'seeing the overview follow the global log (no reload, no polling)';
  await page.waitForFunction((id) => document.querySelector(`#overview tr[data-eid="${id}"]`)?.dataset.state === 'completed', waiting);
  await page.locator('#timeline tr[data-type="replied"]').waitFor();
  if (shots) await page.screenshot({ path: `${shots}/execution.png`, fullPage: true });

  step = 'reading it on a phone';
  await fitsAPhone(page);

  step = 'checking that no error was shown';
  await checkNoErrors(page, scriptErrors);
  console.log(`declined ${waiting} from the overview`);
} catch (error) {
  await failed('overview.mjs', step, error, page);
} finally {
  await browser?.close();
}
