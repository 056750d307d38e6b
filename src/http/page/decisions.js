// Decisions: a card per request waiting for a person, with drafts kept per request.
// W-6: pending requests as cards above the composer, one per wait: a structured question or
// form as its fields, an approval or permission as Approve/Decline. A draft is kept per wait
// (sessionStorage: a reload keeps it); Skip declines the whole request. A new request never
// takes the focus, and a card is drawn again only when the set of pending requests changes.
let decisionsKey = '';
const draftOf = (id) => store.get('draft.' + id, {});
function pending() {
  return transcript.flatMap((m) => (m.blocks || []).filter((b) => b.type === 'wait' && b.status === 'open' && !b.inherited)
    .map((b) => ({...b, execution_id: m.execution_id})));
}
function field(w, item) {
  const d = draftOf(w.wait_id)[item.id], name = esc(item.id), group = `${esc(w.wait_id)}-${name}`;
  let input;
  if (item.type === 'choice') {
    const type = item.multiple ? 'checkbox' : 'radio', picked = (o) => item.multiple ? (d || []).includes(o) : d === o;
    input = item.options.map((o) => `<label><input type="${type}" name="${group}" value="${esc(o)}" data-item="${name}"${picked(o) ? ' checked' : ''}> ${esc(o)}</label>`).join('') +
      (item.other ? `<label>Other <input type="text" data-item="${name}" data-other value="${esc(item.options.includes(d) ? '' : (typeof d === 'string' ? d : ''))}"></label>` : '');
  } else if (item.type === 'boolean') {
    input = `<label><input type="checkbox" data-item="${name}"${d ? ' checked' : ''}> yes</label>`;
  } else if (item.type === 'number' || item.type === 'integer') {
    input = `<input type="number" data-item="${name}" aria-label="${esc(item.label || item.id)}" step="${item.type === 'integer' ? 1 : 'any'}"${item.min != null ? ` min="${item.min}"` : ''}${item.max != null ? ` max="${item.max}"` : ''} value="${d ?? ''}">`;
  } else {
    input = `<input type="text" data-item="${name}" aria-label="${esc(item.label || item.id)}"${item.max_length ? ` maxlength="${item.max_length}"` : ''} value="${esc(d ?? '')}">`;
  }
  return `<fieldset data-field="${name}"><legend>${esc(item.label || item.id)}${item.required === false ? ' <span class="muted">(optional)</span>' : ''}</legend>${input}<span class="field-error" role="alert" data-error="${name}"></span></fieldset>`;
}
function card(w) {
  const id = esc(w.wait_id), items = w.request?.items || [];
  const sending = submitted[w.wait_id] ? '<span class="muted" data-delivery>sending…</span>' : '';
  const until = w.deadline_ms ? ` <span class="muted">· until ${new Date(w.deadline_ms).toLocaleTimeString()}</span>` : '';
  const perm = w.request?.permission ? ` <span class="muted">(${esc(w.request.permission)}${w.request.resource ? ' on ' + esc(w.request.resource) : ''})</span>` : '';
  const body = items.length ? items.map((item) => field(w, item)).join('')
    : `<label>Note <input type="text" data-item="note" value="${esc(draftOf(w.wait_id).note ?? '')}"></label>`;
  const submit = items.length ? 'Submit' : w.kind === 'question' ? 'Answer' : 'Approve';
  return `<form class="decision" data-decision="${id}" data-eid="${esc(w.execution_id)}" aria-label="${esc(w.prompt)}">
    <strong>${esc(w.prompt)}</strong>${perm}${until}${body}
    <button type="submit">${submit}</button> <button type="button" data-skip="${id}">${items.length ? 'Skip' : 'Decline'}</button> ${sending}</form>`;
}
// The answer a card's inputs give now, as its request's items want it.
function collect(form, w) {
  const items = w.request?.items || [], answer = {};
  for (const item of items) {
    const inputs = [...form.querySelectorAll(`[data-item="${CSS.escape(item.id)}"]`)];
    let value;
    if (item.type === 'choice' && item.multiple) value = inputs.filter((i) => i.checked).map((i) => i.value);
    else if (item.type === 'choice') value = inputs.find((i) => i.checked)?.value ?? (inputs.find((i) => i.dataset.other !== undefined)?.value.trim() || undefined);
    else if (item.type === 'boolean') value = inputs[0]?.checked ?? false;
    else if (item.type === 'number' || item.type === 'integer') value = inputs[0]?.value === '' ? undefined : Number(inputs[0]?.value);
    else value = inputs[0]?.value || undefined;
    if (item.type === 'choice' && item.multiple && !value.length && item.required === false) value = undefined;
    if (value !== undefined) answer[item.id] = value;
  }
  if (!items.length) { const note = form.querySelector('[data-item="note"]')?.value.trim(); return note || undefined; }
  return answer;
}
function renderDecisions(force) {
  const waits = pending(), key = waits.map((w) => w.wait_id + (submitted[w.wait_id] ? '+' : '')).join(',');
  if (key === decisionsKey && !force) return;
  // A request no longer pending keeps no draft.
  for (const id of decisionsKey.split(',').map((k) => k.replace(/\+$/, '')).filter(Boolean)) {
    if (!waits.some((w) => w.wait_id === id)) sessionStorage.removeItem('op.draft.' + id);
  }
  const box = $('decisions'), focused = document.activeElement, keep = box.contains(focused)
    ? [focused.closest('form')?.dataset.decision, focused.dataset.item, focused.value] : null;
  const errors = [...box.querySelectorAll('[data-error]')].map((e) => [e.closest('form').dataset.decision, e.dataset.error, e.textContent]);
  decisionsKey = key;
  box.innerHTML = waits.map(card).join('') || '<p class="muted">none pending</p>';
  for (const [wait, name, text] of errors) {
    const at = box.querySelector(`[data-decision="${wait}"] [data-error="${name}"]`);
    if (at) at.textContent = text;
  }
  if (keep) {
    const back = [...box.querySelectorAll(`[data-decision="${keep[0]}"] [data-item="${keep[1]}"]`)].find((i) => i.value === keep[2]) ||
      box.querySelector(`[data-decision="${keep[0]}"] [data-item="${keep[1]}"]`);
    back?.focus();
  }
  box.querySelectorAll('form.decision').forEach((form) => {
    const w = waits.find((one) => one.wait_id === form.dataset.decision);
    const save = () => store.set('draft.' + w.wait_id, (w.request?.items || []).length ? collect(form, w) : {note: collect(form, w) ?? ''});
    form.oninput = save; form.onchange = save;
    form.onsubmit = (event) => {
      event.preventDefault();
      form.querySelectorAll('[data-error]').forEach((e) => e.textContent = '');
      const answer = collect(form, w);
      submitted[w.wait_id] = true; renderDecisions(true);
      command('answer', answer === undefined ? {wait_id: w.wait_id} : {wait_id: w.wait_id, answer}, w.execution_id)
        .then(() => soon('transcript', loadTranscript, 100));
    };
    form.querySelector('[data-skip]').onclick = () => {
      submitted[w.wait_id] = true; renderDecisions(true);
      command('decline', {wait_id: w.wait_id}, w.execution_id).then(() => soon('transcript', loadTranscript, 100));
    };
  });
}
