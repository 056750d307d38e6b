// The page's sign-in in a real browser: the one-time link `serve` wrote opens the page signed
// in (a cookie; no token typed, none in the URL it lands on); the admin panels show the
// executions; a reload keeps it signed in; a session token typed for one session does not
// hide the admin panels; the link a second time is refused.
//
//   node tests/browser/signin.mjs LINK SESSION_TOKEN EXECUTION
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded.
import { launch, failed, recordErrors, checkNoErrors } from './page.mjs';

const [link, sessionToken, execution] = process.argv.slice(2);
if (!link || !sessionToken || !execution) {
  console.error('usage: node signin.mjs LINK SESSION_TOKEN EXECUTION');
  process.exit(2);
}
const listed = (page, id) => page.locator(`#overview tr[data-eid="${id}"]`).waitFor();

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
try {
  ({ browser, page, scriptErrors } = await launch());

  step = 'opening the sign-in link';
  const opened = await page.goto(link);
  if (!opened.ok()) throw new Error(`the link answered ${opened.status()}`);
  if (page.url().includes('code=')) throw new Error(`the page kept the code in its URL: ${page.url()}`);
  await recordErrors(page);

  step = 'seeing the executions with no token typed';
  await listed(page, execution);
  if (await page.getByLabel('Token', { exact: true }).inputValue()) throw new Error('a token was filled in');

  step = 'reloading the page';
  await page.reload();
  await recordErrors(page);
  await listed(page, execution);

  step = 'typing a session token, then searching the overview';
  await page.getByLabel('Token', { exact: true }).fill(sessionToken);
  await page.getByRole('button', { name: 'Use token' }).click();
  await page.getByLabel('Any id', { exact: true }).fill(execution);
  await page.waitForFunction((id) => {
    const all = [...document.querySelectorAll('#overview tr[data-eid]')];
    return all.length === 1 && all[0].dataset.eid === id;
  }, execution);

  step = 'checking that no error was shown';
  await checkNoErrors(page, scriptErrors);

  step = 'opening the link a second time';
  const again = await page.goto(link);
  if (again.status() !== 401) throw new Error(`a used link answered ${again.status()}`);
  console.log('signed in once by the link; the admin panels answered through reloads and a session token');
} catch (error) {
  await failed('signin.mjs', step, error, page);
} finally {
  await browser?.close();
}
