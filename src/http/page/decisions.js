// Decisions: a panel per request waiting for a person, above the composer (W-6, the product
// document's decision panels). A panel has a header (what is asked, by which execution, until
// when) and a collapse; a form of several questions shows one at a time with Back, Next and,
// on the last, Submit; an approval or a single question shows its field at once. Skip (or
// Decline) declines the whole request. Drafts are kept per request and question, and where
// the person was in the form and whether it was folded, through navigation, collapse and
// reload (sessionStorage); none of that sends a command. Submitting shows the answer as sent
// at once, with its delivery; an answer whose delivery is not confirmed keeps its command id,
// and sending it again cannot make a second answer (K-4). A new request never takes the focus,
// and the panels are drawn again only when the set of requests or a delivery changes.
let decisionsKey = '';
const seenWaits = new Set();
const draftOf = (id) => store.get('draft.' + id, {});
const PER_WAIT = ['draft.', 'step.', 'fold.', 'sent.'];
function pending() {
  return transcript.flatMap((m) => (m.blocks || []).filter((b) => b.type === 'wait' && b.status === 'open' && !b.inherited)
    .map((b) => ({...b, execution_id: m.execution_id})));
}
// The "Other" text of a draft: the value (or, for several choices, the one) not among the options.
const otherOf = (item, d) => [].concat(d ?? []).find((v) => typeof v === 'string' && !item.options.includes(v)) ?? '';
function field(w, item) {
  const d = draftOf(w.wait_id)[item.id], name = esc(item.id), group = `${esc(w.wait_id)}-${name}`;
  let input;
  if (item.type === 'choice') {
    const type = item.multiple ? 'checkbox' : 'radio', picked = (o) => item.multiple ? (d || []).includes(o) : d === o;
    input = item.options.map((o) => `<label class="option"><input type="${type}" name="${group}" value="${esc(o)}" data-item="${name}"${picked(o) ? ' checked' : ''}> ${esc(o)}</label>`).join('') +
      (item.other ? `<label class="option">Other <input type="text" data-item="${name}" data-other value="${esc(otherOf(item, d))}"></label>` : '');
  } else if (item.type === 'boolean') {
    input = `<label class="option"><input type="checkbox" data-item="${name}"${d ? ' checked' : ''}> yes</label>`;
  } else if (item.type === 'number' || item.type === 'integer') {
    input = `<input type="number" data-item="${name}" aria-label="${esc(item.label || item.id)}" step="${item.type === 'integer' ? 1 : 'any'}"${item.min != null ? ` min="${item.min}"` : ''}${item.max != null ? ` max="${item.max}"` : ''} value="${d ?? ''}">`;
  } else {
    input = `<input type="text" data-item="${name}" aria-label="${esc(item.label || item.id)}"${item.max_length ? ` maxlength="${item.max_length}"` : ''} value="${esc(d ?? '')}">`;
  }
  return `<fieldset data-field="${name}"><legend>${esc(item.label || item.id)}${item.required === false ? ' <span class="muted">(optional)</span>' : ''}</legend>${input}<span class="field-error" role="alert" data-error="${name}"></span></fieldset>`;
}
function card(w) {
  const id = esc(w.wait_id), items = w.request?.items || [], sent = submitted[w.wait_id];
  const folded = store.get('fold.' + w.wait_id, false), form = items.length > 1;
  const until = w.deadline_ms ? ` · until ${esc(new Date(w.deadline_ms).toLocaleTimeString())}` : '';
  const perm = w.request?.permission ? ` <span class="muted">(${esc(w.request.permission)}${w.request.resource ? ' on ' + esc(w.request.resource) : ''})</span>` : '';
  const fields = items.length ? items.map((item) => field(w, item)).join('')
    : `<label>Note <input type="text" data-item="note" value="${esc(draftOf(w.wait_id).note ?? '')}"></label>`;
  const submit = items.length ? 'Submit' : w.kind === 'question' ? 'Answer' : 'Approve';
  const buttons = (form ? '<button type="button" data-back>Back</button> <button type="button" data-next>Next</button> ' : '') +
    `<button type="submit">${submit}</button> <button type="button" data-skip="${id}">${items.length ? 'Skip' : 'Decline'}</button>`;
  const delivery = sent ? `<p data-submitted>${sent.kind === 'decline' ? 'Declined' : 'Your answer'}: ${esc(sent.text)}
    · <span data-delivery="${esc(sent.state)}">${esc(DELIVERY[sent.state])}</span>
    ${sent.state === 'unconfirmed' ? '<button type="button" data-again>Send again</button>' : ''}</p>` : '';
  return `<form class="decision" data-decision="${id}" data-eid="${esc(w.execution_id)}" aria-label="${esc(w.prompt)}">
    <header><strong>${esc(w.prompt)}</strong>${perm}
      <button type="button" data-fold aria-expanded="${!folded}">${folded ? 'Expand' : 'Collapse'}</button><br>
      <span class="muted">asked by <button type="button" class="exec" data-eid="${esc(w.execution_id)}">${esc(short(w.execution_id))}</button>${until}
      ${form ? `· <span data-counter></span>` : ''}</span></header>
    ${delivery}<div class="decision-body"${folded || sent ? ' hidden' : ''}>${fields}<div class="decision-buttons">${buttons}</div></div></form>`;
}
const CONTROLS = ['[data-fold]', '[data-back]', '[data-next]', 'button[type="submit"]', '[data-skip]', '[data-again]'];
const DELIVERY = {sending: 'sending…', sent: 'sent: the execution takes it next', unconfirmed: 'not confirmed yet'};
// Shows question `index` of a form of several (the others keep their drafts, hidden).
function showStep(form, w, index) {
  const items = w.request?.items || [];
  if (items.length < 2) return;
  const at = Math.max(0, Math.min(index, items.length - 1));
  store.set('step.' + w.wait_id, at);
  form.querySelectorAll('fieldset[data-field]').forEach((set, i) => set.hidden = i !== at);
  form.querySelector('[data-counter]').textContent = `question ${at + 1} of ${items.length}`;
  form.querySelector('[data-back]').disabled = at === 0;
  form.querySelector('[data-next]').hidden = at === items.length - 1;
  form.querySelector('button[type="submit"]').hidden = at !== items.length - 1;
}
// The answer a card's inputs give now, as its request's items want it.
function collect(form, w) {
  const items = w.request?.items || [], answer = {};
  for (const item of items) {
    const inputs = [...form.querySelectorAll(`[data-item="${CSS.escape(item.id)}"]`)];
    let value;
    const other = inputs.find((i) => i.dataset.other !== undefined)?.value.trim();
    if (item.type === 'choice' && item.multiple) value = inputs.filter((i) => i.checked).map((i) => i.value).concat(other ? [other] : []);
    else if (item.type === 'choice') value = inputs.find((i) => i.checked)?.value ?? (other || undefined);
    else if (item.type === 'boolean') value = inputs[0]?.checked ?? false;
    else if (item.type === 'number' || item.type === 'integer') value = inputs[0]?.value === '' ? undefined : Number(inputs[0]?.value);
    else value = inputs[0]?.value || undefined;
    if (item.type === 'choice' && item.multiple && !value.length && item.required === false) value = undefined;
    if (value !== undefined) answer[item.id] = value;
  }
  if (!items.length) { const note = form.querySelector('[data-item="note"]')?.value.trim(); return note || undefined; }
  return answer;
}
// What was sent, as a person reads it.
function answered(w, answer) {
  const items = w.request?.items || [];
  if (!items.length) return answer ?? (w.kind === 'question' ? '(no answer)' : 'approved');
  return items.filter((item) => answer[item.id] !== undefined)
    .map((item) => `${item.label || item.id}: ${[].concat(answer[item.id]).join(', ')}`).join(' · ') || '(nothing)';
}
// Sends an answer or a decline, keeping its command id until its delivery is confirmed.
// `deliver(w)` sends the kept submission again (its command id too).
async function deliver(w, kind, answer) {
  const sent = kind === undefined ? submitted[w.wait_id]
    : {command_id: uuid(), kind, answer, text: kind === 'decline' ? 'the whole request' : answered(w, answer)};
  if (!sent) return;
  sent.state = 'sending';
  submitted[w.wait_id] = sent; store.set('sent.' + w.wait_id, sent); renderDecisions(true);
  if (snapshot && current === w.execution_id) render();
  const fields = {command_id: sent.command_id, wait_id: w.wait_id, ...(sent.answer === undefined ? {} : {answer: sent.answer})};
  const outcome = await command(sent.kind, fields, w.execution_id);
  if (outcome === 'refused') { delete submitted[w.wait_id]; sessionStorage.removeItem('op.sent.' + w.wait_id); }
  else { sent.state = outcome === 'unconfirmed' ? 'unconfirmed' : 'sent'; store.set('sent.' + w.wait_id, sent); }
  renderDecisions(true);
  if (snapshot && current === w.execution_id) render();
  soon('transcript', loadTranscript, 100);
}
function renderDecisions(force) {
  const waits = pending(), key = `${sid}|` + waits.map((w) => `${w.wait_id}=${submitted[w.wait_id]?.state ?? ''}`).join(',');
  if (key === decisionsKey && !force) return;
  // A request of this session no longer pending keeps nothing (another session's, or one
  // whose transcript is still loading, keeps all).
  const [shown, before] = decisionsKey.split('|');
  if (shown === sid && transcriptOf === sid) {
    for (const id of (before ?? '').split(',').map((k) => k.split('=')[0]).filter(Boolean)) {
      if (!waits.some((w) => w.wait_id === id)) PER_WAIT.forEach((prefix) => sessionStorage.removeItem('op.' + prefix + id));
    }
  }
  // What a reload kept of a delivery in flight, read when a request is first seen: sending it
  // again sends the same command id.
  for (const w of waits.filter((w) => !seenWaits.has(w.wait_id))) {
    seenWaits.add(w.wait_id);
    const kept = store.get('sent.' + w.wait_id, null);
    if (kept && !submitted[w.wait_id]) submitted[w.wait_id] = {...kept, state: kept.state === 'sent' ? 'sent' : 'unconfirmed'};
  }
  const box = $('decisions'), focused = document.activeElement, keep = box.contains(focused)
    ? [focused.closest('form')?.dataset.decision, focused.dataset.item, focused.value, CONTROLS.find((c) => focused.matches(c))] : null;
  const errors = [...box.querySelectorAll('[data-error]')].map((e) => [e.closest('form').dataset.decision, e.dataset.error, e.textContent]);
  decisionsKey = key;
  box.innerHTML = waits.map(card).join('') || '<p class="muted">none pending</p>';
  box.querySelectorAll('form.decision').forEach((form) => wire(form, waits.find((one) => one.wait_id === form.dataset.decision)));
  for (const [wait, name, text] of errors.filter(([, , text]) => text)) {
    const at = box.querySelector(`[data-decision="${CSS.escape(wait)}"] [data-error="${CSS.escape(name)}"]`);
    if (!at) continue;
    at.textContent = text;
    // The question the server refused is the one shown.
    const w = waits.find((one) => one.wait_id === wait), form = at.closest('form');
    showStep(form, w, (w.request?.items || []).findIndex((item) => item.id === name));
  }
  // What had the focus has it again: a field (its option by value) or a panel's control.
  if (keep) {
    const inCard = `[data-decision="${CSS.escape(keep[0] ?? '')}"]`;
    const back = keep[1] !== undefined
      ? [...box.querySelectorAll(`${inCard} [data-item="${CSS.escape(keep[1])}"]`)].find((i) => i.value === keep[2]) ||
        box.querySelector(`${inCard} [data-item="${CSS.escape(keep[1])}"]`)
      : box.querySelector(`${inCard} ${keep[3]}`);
    back?.focus();
  }
}
// A panel's controls: drafts saved as typed, navigation, collapse, submit, skip, send again.
function wire(form, w) {
  const items = w.request?.items || [];
  const save = () => store.set('draft.' + w.wait_id, items.length ? collect(form, w) : {note: collect(form, w) ?? ''});
  form.oninput = save; form.onchange = save;
  showStep(form, w, store.get('step.' + w.wait_id, 0));
  const step = () => store.get('step.' + w.wait_id, 0);
  // Back and Next take the focus to the question they show.
  const go = (by) => {
    showStep(form, w, step() + by);
    form.querySelector('fieldset[data-field]:not([hidden]) input')?.focus();
  };
  form.querySelector('[data-back]')?.addEventListener('click', () => go(-1));
  form.querySelector('[data-next]')?.addEventListener('click', () => go(1));
  form.querySelector('[data-fold]').onclick = () => { store.set('fold.' + w.wait_id, !store.get('fold.' + w.wait_id, false)); renderDecisions(true); };
  form.querySelector('button.exec').onclick = () => openExecution(w.execution_id);
  form.onsubmit = (event) => {
    event.preventDefault();
    // Enter before the last question moves on: nothing is sent unseen.
    if (items.length > 1 && step() < items.length - 1) return go(1);
    form.querySelectorAll('[data-error]').forEach((e) => e.textContent = '');
    deliver(w, 'answer', collect(form, w));
  };
  form.querySelector('[data-skip]').onclick = () => deliver(w, 'decline');
  form.querySelector('[data-again]')?.addEventListener('click', () => deliver(w));
}
