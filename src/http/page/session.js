// A session: its Activity (branches in three sections) and its transcript, live over its stream.
// Activity (B-2..B-5): the session's branches in three sections, live over the session stream.
function openSession(id) {
  sessionStream?.abort(); executionStream?.abort();
  delete sessionWords[id];
  sid = id; activity = null; current = null; snapshot = null; openBranches.clear(); transcript = []; transcriptOf = null;
  $('transcript').innerHTML = '<p class="muted">Loading…</p>'; renderDecisions();
  store.set('session', id); $('session-id').value = id; $('error').textContent = ''; say('');
  $('activity').innerHTML = '<p class="muted">Loading…</p>';
  $('execution').innerHTML = '<p class="muted">Choose an execution.</p>'; shownExecution = '';
  renderSessions();
  const controller = sessionStream = new AbortController(), cursor = 'cursor.' + id;
  // Each (re)connection reads the stored Activity first, then resumes from the saved position.
  follow(controller, id, () => `/v1/sessions/${id}/stream?after=${store.get(cursor, 0)}`, (frame) => {
    if (frame.id) store.set(cursor, Number(frame.id));
    if (frame.event === 'cursor') return;  // the server read past others' events: nothing new
    if (frame.event === 'session_reload') loadActivity(); else soon('activity', loadActivity, 250);
    if (frame.data?.execution_id) changedExecutions.add(frame.data.execution_id);
    soon('transcript', () => loadTranscript(true), 250);
  }, () => { loadActivity(); loadTranscript(); });
}
async function loadActivity() {
  const at = sid;
  if (!at) return;
  try {
    const data = await api('GET', `/v1/sessions/${at}/activity`, sessions[at]);
    if (at === sid) { activity = data; renderActivity(); }
  } catch (e) {
    if (at !== sid) return;
    if (confirmed(e)) fail(at, 'Activity: ' + e.message); else soon('activity', loadActivity, 1000);
  }
}

const SECTIONS = [['needs-attention', 'Needs attention', 'needs_attention'], ['in-progress', 'In progress', 'in_progress'], ['history', 'History', 'history']];
function renderActivity() {
  // The branches the user expanded stay expanded: the page itself is what remembers them.
  const shown = document.querySelectorAll('#activity details[data-branch]');
  if (shown.length) { openBranches.clear(); shown.forEach((d) => d.open && openBranches.add(d.dataset.branch)); }
  $('activity').innerHTML = `<h2>Session <span class="muted">${esc(sid)}</span></h2>` + SECTIONS.map(([id, title, key]) =>
    `<section id="${id}" aria-labelledby="${id}-title"><h3 id="${id}-title">${title} <span id="${id}-count" class="count">${activity[key].length}</span></h3>` +
    (activity[key].map(branch).join('') || '<p class="muted">none</p>') + '</section>').join('');
  document.querySelectorAll('button.exec').forEach((b) => b.onclick = () => openExecution(b.dataset.eid));
  composerShape();
}
function branch(row) {
  const executions = row.details.map((d) => `<li><button class="exec${d.execution_id === current ? ' on' : ''}" data-eid="${esc(d.execution_id)}"
    data-state="${esc(d.state)}">${d.child_of ? '<span class="muted">↳ child task:</span> ' : ''}${esc(d.request) || '<span class="muted">(no request)</span>'} · ${esc(d.label)}</button></li>`).join('');
  return `<details data-branch="${esc(row.branch_id)}" data-status="${esc(row.status)}"${openBranches.has(row.branch_id) ? ' open' : ''}>
    <summary><b>${esc(row.heading)}</b> · ${row.executions} execution${row.executions === 1 ? '' : 's'}${row.child_tasks ? ` + ${row.child_tasks} child task${row.child_tasks === 1 ? '' : 's'}` : ''} · ${esc(row.label)}
    <span class="muted">(${esc(row.status)})</span></summary><ul>${executions}</ul></details>`;
}

// C-1: the session's transcript from the event log (GET …/messages), read again as the
// session's stream moves: each message with its reasoning, text, tool calls and receipts,
// steps, steering where it arrived, and the waits it opened with their outcome.
let transcript = [];
let transcriptOf = null;  // the session `transcript` was read for (none while it loads)
const changedExecutions = new Set();  // executions the session stream said moved
// One execution's assistant message read whole: a long turn's blocks come in parts
// (`more_after_seq`), and a request opened late in it must still reach Decisions.
async function assistantOf(at, eid, message) {
  for (let parts = 0; parts < 100 && message && message.more_after_seq != null; parts++) {
    const more = (await api('GET', `/v1/sessions/${at}/messages?execution=${eid}&after_seq=${message.more_after_seq}`, sessions[at])).messages[0];
    message = {...more, blocks: message.blocks.concat(more.blocks || [])};
  }
  return message;
}
// The whole transcript at first; then, as the stream moves, only the executions it named (a new
// one reads the whole again).
async function loadTranscript(changedOnly) {
  const at = sid;
  if (!at) return;
  const changed = [...changedExecutions];
  changedExecutions.clear();
  try {
    let messages;
    if (changedOnly && changed.every((eid) => transcript.some((m) => m.execution_id === eid))) {
      messages = transcript.slice();
      for (const eid of changed) {
        const read = (await api('GET', `/v1/sessions/${at}/messages?execution=${eid}`, sessions[at])).messages[0];
        const whole = await assistantOf(at, eid, read);
        const i = messages.findIndex((m) => m.role === 'assistant' && m.execution_id === eid);
        if (i >= 0 && whole) messages[i] = whole;
      }
    } else {
      messages = [];
      let after = null;
      for (let pages = 0; pages < 20; pages++) {
        const page = await api('GET', `/v1/sessions/${at}/messages?limit=100${after ? '&after=' + after : ''}`, sessions[at]);
        messages = messages.concat(page.messages);
        if (!page.next) break;
        after = page.next;
      }
      for (let i = 0; i < messages.length; i++) {
        if (messages[i].more_after_seq != null) messages[i] = await assistantOf(at, messages[i].execution_id, messages[i]);
      }
    }
    if (at === sid) { transcript = messages; transcriptOf = at; renderTranscript(); renderDecisions(); }
  } catch (e) {
    if (at !== sid) return;
    if (confirmed(e)) fail(at, 'Transcript: ' + e.message); else soon('transcript', loadTranscript, 1000);
  }
}
function blockHtml(b) {
  const cls = `block${b.inherited ? ' inherited' : ''}`, receipt = (r) => r
    ? ` → <span class="st-${esc(r.status)}">${esc(r.status)}</span>${r.output ? `<details><summary>output</summary><pre>${esc(r.output)}</pre></details>` : ''}`
    : ' <span class="muted">…</span>';
  switch (b.type) {
    case 'reasoning': return `<details class="${cls}"><summary class="muted">reasoning</summary><pre>${esc(b.text)}</pre></details>`;
    case 'text': return `<p class="${cls}">${esc(b.text)}</p>`;
    case 'tool_call': return `<div class="${cls}" data-block="tool_call">${esc(b.tool)} <code>${esc(JSON.stringify(b.args))}</code>${receipt(b.receipt)}</div>`;
    case 'step': return `<div class="${cls}" data-block="step">step ${esc(b.step_id)}${receipt(b.receipt)}</div>`;
    case 'steer': return `<p class="${cls} steer">steer: ${esc(b.text)}</p>`;
    case 'error': return `<p class="${cls} st-failed">${esc(b.text)}</p>`;
    case 'wait': return `<div class="${cls}" data-block="wait" data-wait-block="${esc(b.wait_id)}" data-wait-state="${esc(b.status)}">${esc(b.kind)}: ${esc(b.prompt)} · <strong>${esc(b.status)}</strong>${b.answer ? ': ' + esc(b.answer) : ''}</div>`;
    default: return '';
  }
}
// E-8: the earlier turns a user message's model requests carry: the turns on the path from
// the root to the message it answers (a summary counts for what it replaced).
function earlierTurns(m) {
  const byId = new Map(transcript.map((x) => [x.message_id, x]));
  const summaries = transcript.filter((x) => x.role === 'summary');
  let turns = 0, at = m.parent_id, seen = 0;
  while (at && seen++ < transcript.length) {
    const parent = byId.get(at), summary = summaries.find((x) => (x.replaces || []).includes(at));
    if (summary) return turns + ` + a summary of ${summary.replaces.length / 2}`;
    if (!parent) break;
    if (parent.role === 'user') turns += 1;
    at = parent.parent_id;
  }
  return String(turns);
}
function renderTranscript() {
  $('transcript').innerHTML = transcript.map((m) => `<article class="${m.role}" data-message="${esc(m.message_id)}" data-role="${m.role}">
    <div class="muted">${m.role}${m.state ? ' · ' + esc(m.state) : ''}${m.replaces ? ` · in place of ${m.replaces.length} messages` : ''}${m.role === 'user' && m.parent_id ? ` · <span data-context>the model sees ${esc(earlierTurns(m))} earlier turn(s)</span>` : ''} · <button class="exec" data-eid="${esc(m.execution_id)}">${esc(m.execution_id)}</button></div>
    ${(m.blocks || []).map(blockHtml).join('')}${m.text ? `<p>${esc(m.text)}</p>` : ''}</article>`).join('') || '<p class="muted">no messages yet</p>';
  $('transcript').querySelectorAll('button.exec').forEach((b) => b.onclick = () => openExecution(b.dataset.eid));
}
