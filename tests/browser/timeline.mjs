// Issue 55's step timeline in a real browser: an execution that ran a tool, asked a person,
// was stopped with its server and answered after the restart. Its view draws one lane per
// attempt (two), a bar per model call and tool call from its start to its end, in the order
// they ran, coloured by outcome, and the wait as a gap that says who it waits for; hovering a
// bar names the step, clicking it opens that event's payload in the table below.
//
//   node tests/browser/timeline.mjs URL SESSION_ID SESSION_TOKEN EXECUTION
//
// Run by tests/it/browser.rs against a real `openprogram serve`. Exit 0 on success; on
// failure exit 1 with one line saying which step failed. Every wait is bounded. With
// SCREENSHOTS=DIR, saves timeline.png there.
import { launch, failed, recordErrors, checkNoErrors, openFromActivity, openSession, fitsAPhone } from './page.mjs';

const [url, session, token, execution] = process.argv.slice(2);
if (!url || !session || !token || !execution) {
  console.error('usage: node timeline.mjs URL SESSION_ID SESSION_TOKEN EXECUTION');
  process.exit(2);
}
const shots = process.env.SCREENSHOTS;

let step = 'launching headless Chromium';
let browser, page, scriptErrors;
try {
  ({ browser, page, scriptErrors } = await launch());
  await page.setViewportSize({ width: 1280, height: 900 });

  step = 'opening the session';
  await page.goto(url);
  await recordErrors(page);
  await openSession(page, token, session);
  await openFromActivity(page, execution);
  await page.locator('#execution-title[data-state="completed"]').waitFor();

  step = 'reading the lanes';
  const chart = page.locator('#lanes');
  await chart.waitFor();
  const lanes = await chart.locator('g.lane').evaluateAll((all) => all.map((lane) => lane.dataset.attempt));
  if (lanes.length !== 2) throw new Error(`expected two lanes (two attempts), saw ${lanes.length}: ${lanes}`);
  const label = await chart.getAttribute('aria-label');
  if (!/2 attempts/.test(label ?? '')) throw new Error(`the chart's label does not say so: ${label}`);

  step = 'reading the bars';
  const bars = await chart.locator('.bar').evaluateAll((all) => all.map((bar) => ({
    kind: bar.dataset.kind, outcome: bar.dataset.outcome, lane: bar.closest('g.lane')?.dataset.attempt,
    start: Number(bar.dataset.start), end: Number(bar.dataset.end), seq: bar.dataset.seq,
    x: Number(bar.getAttribute('x')), fill: getComputedStyle(bar).fill, title: bar.querySelector('title')?.textContent ?? '',
  })));
  const kinds = bars.map((bar) => bar.kind).join(' ');
  // The script: echo, ask, (restart), echo, reply; every tool and model call confirmed.
  for (const want of ['model', 'tool', 'wait']) {
    if (!bars.some((bar) => bar.kind === want)) throw new Error(`no ${want} bar: ${kinds}`);
  }
  const sorted = [...bars].sort((a, b) => a.start - b.start || Number(a.seq) - Number(b.seq));
  if (sorted.some((bar, i) => i > 0 && bar.x + 0.01 < sorted[i - 1].x)) throw new Error(`a later bar is drawn left of an earlier one: ${kinds}`);
  const seqs = sorted.filter((bar) => bar.kind !== 'wait').map((bar) => Number(bar.seq));
  if (seqs.some((seq, i) => i > 0 && seq <= seqs[i - 1])) throw new Error(`the calls are not in the order they ran: ${seqs}`);
  if (bars.some((bar) => bar.end < bar.start)) throw new Error('a bar ends before it starts');
  const tools = bars.filter((bar) => bar.kind === 'tool');
  if (tools.length !== 2 || new Set(tools.map((bar) => bar.lane)).size !== 2) {
    throw new Error(`expected one echo in each lane: ${JSON.stringify(tools)}`);
  }
  if (!tools.every((bar) => bar.outcome === 'confirmed' && /echo/.test(bar.title))) throw new Error(`a tool bar: ${JSON.stringify(tools)}`);
  const wait = bars.find((bar) => bar.kind === 'wait');
  if (wait.outcome !== 'answered' || !/a person/.test(wait.title)) throw new Error(`the wait: ${JSON.stringify(wait)}`);
  const waitBar = wait;
  if (!(tools[0].end <= waitBar.start && waitBar.end <= tools[1].start)) throw new Error('the wait is not between the two tool calls');
  const colour = (outcome) => bars.find((bar) => bar.outcome === outcome)?.fill;
  if (colour('confirmed') === colour('answered')) throw new Error('a confirmed call and an answered wait share a colour');
  if (new Set(bars.filter((bar) => bar.outcome === 'confirmed').map((bar) => bar.fill)).size > 2) throw new Error('confirmed bars of one kind differ in colour');

  if (shots) await chart.screenshot({ path: `${shots}/timeline.png` });

  step = "opening a bar's event from the keyboard, and another's with a click";
  const picked = (seq) => page.waitForFunction((s) => {
    const row = document.querySelector(`#timeline tr[data-seq="${s}"]`);
    const details = row?.querySelector('details');
    return row?.classList.contains('picked') && (!details || details.open);
  }, seq);
  const echo = chart.locator('.bar[data-kind="tool"]').first();
  const seq = await echo.getAttribute('data-seq');
  await echo.focus();
  await page.keyboard.press('Enter');
  await picked(seq);
  const model = chart.locator('.bar[data-kind="model"]').last();
  const other = await model.getAttribute('data-seq');
  // At the bar's own place on the screen: whatever lies over it would take the click.
  await model.click({ force: true });
  await picked(other);

  step = 'reading it on a phone';
  await fitsAPhone(page);

  step = 'checking that no error was shown';
  await checkNoErrors(page, scriptErrors);
  console.log(`timeline of ${execution}: ${lanes.length} lanes, bars ${kinds}`);
} catch (error) {
  await failed('timeline.mjs', step, error, page);
} finally {
  await browser?.close();
}
