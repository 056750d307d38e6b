// One execution: its snapshot, controls, waits, receipts and event table, live over its stream.
// One execution: its timeline, receipts, waits, processes and the controls it offers now.
function openExecution(eid) {
  executionStream?.abort();
  current = eid; events = []; snapshot = null;
  $('error').textContent = ''; say('');
  $('execution').innerHTML = '<p class="muted">Loading…</p>'; shownExecution = '';
  if (activity) renderActivity();
  const at = sid, controller = executionStream = new AbortController();
  let last = 0;
  follow(controller, at, () => `/v1/sessions/${at}/executions/${eid}/events/stream?after=${last}`, (frame) => {
    if (frame.event === 'resync') { events = []; last = frame.data.last_seq; }
    else { events.push(frame.data); last = frame.data.seq; }
    soon('snapshot', refresh, 100);
  }, refresh);
}
async function refresh() {
  const at = sid, eid = current;
  if (!eid) return;
  try {
    const s = await api('GET', `/v1/sessions/${at}/executions/${eid}`, sessions[at]);
    if (eid === current) { snapshot = s; render(); }
  } catch (e) {
    if (eid !== current) return;
    if (confirmed(e)) fail(at, 'Execution: ' + e.message); else soon('snapshot', refresh, 1000);
  }
}
// A command keeps its command_id across retries (the caller's, if it gives one), so a lost
// answer never makes a duplicate (K-4). Returns the reply's status, `refused`, or
// `unconfirmed` when no answer came.
async function command(kind, fields, eid = current) {
  const at = sid, body = {command_id: uuid(), kind, ...fields};
  $('error').textContent = '';
  let outcome = 'unconfirmed';
  for (let attempt = 1; ; attempt++) {
    try {
      const reply = await api('POST', `/v1/sessions/${at}/executions/${eid}/commands`, sessions[at], body);
      if (reply.execution_id && at === sid) { loadActivity(); openExecution(reply.execution_id); }
      if (at === sid) say(`${kind}: ${reply.status}` + (reply.execution_id ? `, opened ${reply.execution_id}` : ''));
      outcome = reply.status;
      break;
    } catch (e) {
      if (confirmed(e)) {
        outcome = 'refused';
        delete submitted[fields.wait_id];
        // W-6: an answer that does not fit names its field: shown by that field.
        const field = e.data?.code === 'invalid_answer' && document.querySelector(`[data-decision="${CSS.escape(fields.wait_id)}"] [data-error="${CSS.escape(String(e.data.field))}"]`);
        if (field) { field.textContent = e.message; renderDecisions(true); } else fail(at, `${kind}: ${e.message}`);
        break;
      }
      if (attempt === 5) { if (at === sid) say(`${kind}: no answer from the server yet`); break; }
      await later(1000);
    }
  }
  soon('snapshot', refresh, 100);
  return outcome;
}
// One event of the timeline: its seq, type, the time since the event before it, and its
// payload (folded when long); a new attempt starts a separated row, receipts show their status.
const ENVELOPE = new Set(['execution_id', 'seq', 'position', 'at_ms', 'writer_epoch', 'type']);
// Every id of an execution, session, effect, wait, process or command in escaped text becomes a
// link that finds its execution in the overview (`find`).
const linkIds = (html) => html.replace(/\b(?:ex|ses|eff|wait|proc|cmd)_[0-9a-f]{32}\b/g,
  (id) => `<a href="#" class="find" data-find="${id}">${id}</a>`);
function find(id) {
  $('ov-id').value = id;
  loadOverview();
  $('overview-title').scrollIntoView();
}
function timelineRow(e, i) {
  const payload = Object.fromEntries(Object.entries(e).filter(([key]) => !ENVELOPE.has(key)));
  const text = JSON.stringify(payload, null, 1);
  const shown = text === '{}' ? '' : text.length > 120
    ? `<details><summary>${esc(text.slice(0, 80).replace(/\s+/g, ' '))}…</summary><pre>${linkIds(esc(text))}</pre></details>`
    : `<pre>${linkIds(esc(text))}</pre>`;
  const since = i === 0 ? '' : `+${Math.max(0, e.at_ms - events[i - 1].at_ms)} ms`;
  const st = e.status ? String(e.status).replace(/([a-z])([A-Z])/g, '$1_$2').toLowerCase() : '';
  const status = st ? ` <span class="st-${esc(st)}">${esc(st)}</span>` : '';
  return `<tr class="${e.type === 'attempt_started' ? 'attempt' : ''}" data-type="${esc(e.type)}" data-seq="${e.seq}">
    <td><span class="muted">${e.seq}</span> ${esc(e.type)}${status}<br><span class="muted duration">${since}</span></td><td>${shown}</td></tr>`;
}
let shownExecution = '';  // the execution view's markup as last drawn
const TITLES = {pause: 'Pause', continue: 'Continue', step: 'Step', cancel: 'Cancel', retry: 'Retry', reconcile: 'Reconcile'};
function render() {
  const s = snapshot, can = (c) => s.capabilities.includes(c);
  const view = $('execution');
  // Keep what the user is typing across re-renders.
  const typed = [...view.querySelectorAll('input[data-keep]')].map((i) => [i.dataset.keep, i.value, i === document.activeElement]);
  const controls = Object.keys(TITLES).filter((c) => can(c) && c !== 'reconcile').map((c) => `<button data-control="${c}">${TITLES[c]}</button>`).join('') +
    (can('reconcile') ? '<button data-control="reconcile" data-outcome="confirmed">Reconcile: it happened</button><button data-control="reconcile" data-outcome="not_applied">Reconcile: it did not</button>' : '') +
    (can('steer') ? '<label>Steer <input type="text" data-keep="steer" aria-label="Steer text"></label><button data-control="steer">Steer</button>' : '') +
    (can('fork') ? '<label>Fork from checkpoint <input type="number" min="1" data-keep="fork" placeholder="latest"></label><button data-control="fork">Fork</button>' : '');
  const waits = s.waits.map((w) => {
    const status = submitted[w.wait_id] && w.status === 'open' ? 'submitted' : w.status, id = esc(w.wait_id);
    const approval = w.kind === 'approval', act = status !== 'open' ? '' : w.request?.items?.length
      ? '<a href="#decisions-title">answer it under Decisions</a>' :
      (can('answer') ? `<input type="text" data-keep="answer-${id}" aria-label="Answer to ${esc(w.prompt)}" placeholder="${approval ? 'note (optional)' : 'your answer'}">` +
        `<button data-answer="${id}">${approval ? 'Approve' : 'Answer'}</button>` : '') +
      (can('decline') ? `<button data-decline="${id}">Decline</button>` : '');
    return `<tr data-wait="${id}"><td>${esc(w.kind)}</td><td>${esc(w.prompt)}</td><td data-wait-status="${esc(status)}">${esc(status)}${w.answer ? ': ' + esc(w.answer) : ''}</td><td>${act}</td></tr>`;
  }).join('');
  // A durable function: its revision and policy, each committed step, and while a version
  // switch waits on them, the differences with the choices that resolve it (F-3, K-7).
  const f = s.function, other = f && (f.policy === 'use_latest' ? 'keep_original' : 'use_latest');
  const fn = !f ? '' : `<h3 id="function">Function ${esc(f.name)} · revision ${f.revision} · <span id="function-policy">${esc(f.policy)}</span> · next step ${f.next_position}
    ${can('set_policy') ? `<button data-policy="${other}">Policy: ${other}</button>` : ''}</h3>
    ${f.differences.length ? `<div id="differences" role="alert"><strong>Version conflict</strong><ul>${f.differences.map((d) => `<li>${esc(d)}</li>`).join('')}</ul>
      ${can('set_policy') && f.policy === 'use_latest' ? '<button data-policy="keep_original" data-then="continue">Keep the original code and continue</button>' : ''}</div>` : ''}
    <table id="steps">${f.completed_steps.map((st) => `<tr><td>${esc(st.step_id)}</td><td>${esc(st.status)}</td><td class="muted">revision ${st.revision}</td></tr>`).join('') || '<tr><td class="muted">no step committed yet</td></tr>'}</table>`;
  // A Job (J-1): what it asks for, its lease or its place in line, and its budget.
  const j = s.job, budget = (used, max, unit) => `${used}${max != null ? ' of ' + max : ''}${unit}`;
  const job = !j ? '' : `<h3 id="job-view">Job · ${Object.entries(j.resources).map(([r, n]) => esc(r) + ' ' + n).join(', ')} ·
    ${j.lease_id ? 'lease <span class="muted">' + esc(j.lease_id) + '</span>' : j.queue_position ? `<span id="job-position">place ${j.queue_position} in line</span>` : 'no lease'}
    · steps ${budget(j.budget_used.steps, j.budget.steps, '')} · held ${budget(j.budget_used.wall_ms, j.budget.wall_ms, ' ms')}</h3>`;
  const processes = s.processes.map((p) => `<h3>Process ${esc(p.process_id)} · ${esc(p.state)}${p.exit_code != null ? ' (exit ' + p.exit_code + ')' : ''} · ${p.output_bytes} bytes
    ${p.state === 'running' && can('stop_process') ? `<button data-stop="${esc(p.process_id)}">Stop</button>` : ''}</h3><pre>${esc(p.output_tail) || '<span class="muted">no output</span>'}</pre>`).join('');
  const html = `<h2 id="execution-title" data-state="${esc(s.state)}">${esc(s.execution_id)} · <span id="execution-state">${esc(s.state)}</span>${s.pause_reason ? ' (' + esc(s.pause_reason) + ')' : ''} · version ${s.version}</h2>
    <div>${controls || '<span class="muted">no controls now</span>'}</div>
    <pre>${esc(s.text) || '<span class="muted">no reply text yet</span>'}</pre>
    ${job}${fn}${waits ? `<h3>Waits</h3><table>${waits}</table>` : ''}${processes}
    <h3>Receipts</h3><table id="receipts">${s.receipts.map((r) => `<tr><td>${esc(r.tool)}</td><td class="st-${esc(r.status)}">${esc(r.status)}</td><td class="muted">${linkIds(esc(r.effect_id))}</td></tr>`).join('') || '<tr><td class="muted">none</td></tr>'}</table>
    <h3>Timeline</h3>${lanesSvg(events, (id) => s.receipts.find((r) => r.effect_id === id)?.tool)}
    <table id="timeline">${events.map(timelineRow).join('')}</table>`;
  // Nothing changed: the view stays as it is (what is open, picked or focused in it too).
  if (html === shownExecution) return;
  shownExecution = html;
  view.innerHTML = html;
  for (const [key, value, focused] of typed) {
    const input = view.querySelector(`input[data-keep="${key}"]`);
    if (input) { input.value = value; if (focused) input.focus(); }
  }
  const typedValue = (key) => view.querySelector(`input[data-keep="${key}"]`)?.value.trim() || '';
  view.querySelectorAll('[data-control]').forEach((b) => b.onclick = () => {
    const kind = b.dataset.control;
    if (kind === 'steer') { const text = typedValue('steer'); if (text) command('steer', {text}); }
    else if (kind === 'fork') { const at = typedValue('fork'); command('fork', at ? {checkpoint: Number(at)} : {}); }
    else if (kind === 'reconcile') command('reconcile', {outcome: b.dataset.outcome});
    else command(kind, {});
  });
  // The same delivery as a decision panel's: one answer per wait, whichever sends it.
  const waitOf = (id) => ({...s.waits.find((w) => w.wait_id === id), execution_id: s.execution_id});
  view.querySelectorAll('[data-answer]').forEach((b) => b.onclick = () => {
    const id = b.dataset.answer, answer = typedValue('answer-' + id);
    deliver(waitOf(id), 'answer', answer || undefined);
  });
  view.querySelectorAll('[data-decline]').forEach((b) => b.onclick = () => deliver(waitOf(b.dataset.decline), 'decline'));
  view.querySelectorAll('[data-stop]').forEach((b) => b.onclick = () => command('stop_process', {process_id: b.dataset.stop}));
  view.querySelectorAll('#lanes .bar').forEach((bar) => {
    bar.onclick = () => pick(bar.dataset.seq);
    bar.onkeydown = (event) => { if (event.key === 'Enter' || event.key === ' ') { event.preventDefault(); pick(bar.dataset.seq); } };
  });
  view.querySelectorAll('a.find').forEach((a) => a.onclick = (event) => { event.preventDefault(); find(a.dataset.find); });
  view.querySelectorAll('[data-policy]').forEach((b) => b.onclick = async () => {
    await command('set_policy', {policy: b.dataset.policy});
    if (b.dataset.then) await command(b.dataset.then, {});
  });
}
