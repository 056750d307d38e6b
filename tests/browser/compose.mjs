// The composer in a real browser: a draft survives a reload; a durable function starts from
// its form (its name from the runtime's list, a revision other than the newest, its input
// refused in the page while it is not JSON); a Job starts holding the units picked from the
// resource queue; and, while a turn runs, the busy choice appears and a message sent with
// "steers the running turn" reaches that turn as its steering (nothing new is admitted).
//
//   node tests/browser/compose.mjs URL SESSION_ID ADMIN_TOKEN FILE
//
// Run by tests/it/browser.rs against a real `openprogram serve --resource model=1`. Exit 0 on
// success; on failure exit 1 with one line saying which step failed. Every wait is bounded.
import { launch, failed, recordErrors, checkNoErrors, fitsAPhone } from './page.mjs';

const [url, session, admin, file] = process.argv.slice(2);
if (!url || !session || !admin || !file) {
  console.error('usage: node compose.mjs URL SESSION_ID ADMIN_TOKEN FILE');
  process.exit(2);
}
const start = (page) => page.getByRole('button', { name: 'Start in this session' }).click();
const opened = async (page, before) => {
  await page.waitForFunction((old) => {
    const title = document.getElementById('execution-title');
    return title && !title.textContent.startsWith(old ?? '\u0000');
  }, before);
  return (await page.locator('#execution-title').textContent()).split(' ')[0];
};

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
try {
  ({ browser, page, scriptErrors } = await launch());

  step = 'opening the session';
  await page.goto(url);
  await recordErrors(page);
  await page.getByLabel('Token', { exact: true }).fill(admin);
  await page.getByRole('button', { name: 'Use token' }).click();
  await page.getByLabel('Session id', { exact: true }).fill(session);
  await page.getByRole('button', { name: 'Open session' }).click();

  step = 'keeping a draft through a reload';
  await page.getByLabel('Message', { exact: true }).fill('a draft kept');
  await page.reload();
  await recordErrors(page);
  if ((await page.getByLabel('Message', { exact: true }).inputValue()) !== 'a draft kept') throw new Error('the draft was lost');

  step = 'refusing a function input that is not JSON';
  await page.getByLabel('What', { exact: true }).selectOption('function');
  await page.getByLabel('Function', { exact: true }).fill('steps');
  await page.waitForFunction(() => [...document.querySelectorAll('#fn-names option')].some((o) => o.value === 'steps'));
  await page.getByLabel(/^Revision/).fill('1');
  await page.getByLabel('Input (JSON)', { exact: true }).fill('{"count": 1,');
  await start(page);
  await page.locator('#fn-input-error', { hasText: 'not JSON' }).waitFor();
  if (await page.locator('#execution-title').count()) throw new Error('an execution was opened for input that is not JSON');

  step = 'starting a durable function from the page';
  await page.getByLabel('Input (JSON)', { exact: true }).fill(JSON.stringify({ count: 1, path: file }));
  await start(page);
  const fn = await opened(page, null);
  await page.locator('#execution-title[data-state="completed"]').waitFor();
  const header = await page.locator('#function').textContent();
  if (!/steps · revision 1\b/.test(header)) throw new Error(`the function ran as "${header}"`);

  step = 'starting a Job holding a unit of model';
  await page.getByLabel('What', { exact: true }).selectOption('agent');
  await page.getByLabel('Script', { exact: true }).fill('[{"reply":"held and done"}]');
  await page.getByLabel(/As a Job/).check();
  await page.getByLabel('Units of model', { exact: true }).fill('1');
  await start(page);
  const job = await opened(page, fn);
  await page.locator('#job-view', { hasText: 'model 1' }).waitFor();
  await page.locator('#execution-title[data-state="completed"]').waitFor();
  await page.getByLabel(/As a Job/).uncheck();

  step = 'seeing the busy choice while a turn runs';
  await page.getByLabel('Message', { exact: true }).fill('a long one');
  await page.getByLabel(/Continue the conversation/).uncheck();
  await page.getByLabel('Script', { exact: true }).fill('[{"tool":"sleep","args":{"ms":600000}},{"reply":"slept"}]');
  await start(page);
  const running = await opened(page, job);
  await page.locator('#execution-title[data-state="running"]').waitFor();
  await page.locator('#busy').waitFor();

  step = 'steering the running turn with a message';
  await page.getByLabel(/The session is running a turn/).selectOption('steer');
  await page.getByLabel('Message', { exact: true }).fill('go faster');
  await start(page);
  await page.locator('#status', { hasText: `steered the running turn ${running}` }).waitFor();
  await page.locator('#transcript .steer', { hasText: 'go faster' }).waitFor();

  step = 'cancelling the running turn';
  await page.locator('[data-control="cancel"]').click();
  await page.locator('#execution-title[data-state="cancelled"]').waitFor();

  step = 'reading it on a phone';
  await fitsAPhone(page);

  step = 'checking that no error was shown';
  await checkNoErrors(page, scriptErrors);
  console.log(`started function ${fn}, Job ${job}, steered ${running}`);
} catch (error) {
  await failed('compose.mjs', step, error, page);
} finally {
  await browser?.close();
}
