// The page's core: what this tab keeps, the API and its event streams, and the session list.
// State kept in this tab only (sessionStorage: tokens are gone when the tab closes); it
// never authorizes anything: every request carries a token the server checks, or, with
// no token, the cookie of the sign-in link `serve` printed (the browser sends it).
const store = {
  get: (key, fallback) => JSON.parse(sessionStorage.getItem('op.' + key) || 'null') ?? fallback,
  set: (key, value) => sessionStorage.setItem('op.' + key, JSON.stringify(value)),
};
const sessions = store.get('sessions', {});  // session id -> token
let sid = null;                              // the session shown
let activity = null;                         // its Activity, as last loaded
const openBranches = new Set();              // branch ids the user expanded
let current = null;                          // the execution shown
let snapshot = null, events = [], submitted = {};
let sessionStream = null, executionStream = null;  // AbortControllers
let signedIn = false;                        // the sign-in cookie answers as the admin token
const $ = (id) => document.getElementById(id);
const esc = (text) => String(text ?? '').replace(/[&<>"]/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));
const later = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// An id as a person tells it from its neighbours: its prefix and last characters (the first
// ones are its time, shared by ids made together).
const short = (id) => String(id).replace(/^([a-z]+_)[0-9a-f]{24}([0-9a-f]{8})$/, '$1…$2');
// A version 4 UUID, also where crypto.randomUUID is missing (a page not served from loopback).
const uuid = () => crypto.randomUUID?.() ?? [...crypto.getRandomValues(new Uint8Array(16))]
  .map((b, i) => (i === 6 ? (b & 15) | 64 : i === 8 ? (b & 63) | 128 : b).toString(16).padStart(2, '0')).join('')
  .replace(/(.{8})(.{4})(.{4})(.{4})(.{12})/, '$1-$2-$3-$4-$5');
$('token').value = store.get('token', '');

// A token's header; none without one (the sign-in cookie speaks then).
const bearer = (token) => token ? {'Authorization': 'Bearer ' + token} : {};
// Any failure of fetch has a status: 0 when no answer came (network, server restarting).
async function api(method, path, token, body) {
  let response;
  try {
    response = await fetch(path, {
      method, headers: {...bearer(token), 'Content-Type': 'application/json'},
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) { throw Object.assign(new Error('no answer from the server'), {status: 0}); }
  const data = await response.json().catch(() => null);
  // Signed in by the cookie, and it no longer answers (expired, a new admin token): say so.
  if (response.status === 401 && !token && signedIn) {
    signedIn = false;
    say('signed out: open a new sign-in link (serve prints one at start) or paste the admin token');
  }
  if (!response.ok) throw Object.assign(new Error(data?.message || String(response.status)), {data, status: response.status});
  return data;
}
// B-6: only a request the server answered with a refusal is an error; loading, a lost
// connection or a server restart is retried quietly with the last data kept on screen.
const confirmed = (e) => e.status >= 400 && e.status < 500;
function fail(at, text) { if (at === sid) $('error').textContent = text; }
function say(text) { $('status').textContent = text || ''; }

// Server-Sent Events through fetch (EventSource cannot send the Authorization header).
async function sse(path, token, signal, onFrame) {
  const response = await fetch(path, {headers: bearer(token), signal});
  if (!response.ok) {
    const data = await response.json().catch(() => null);
    throw Object.assign(new Error(data?.message || String(response.status)), {status: response.status});
  }
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, end); buffer = buffer.slice(end + 2);
      const field = (name) => frame.split('\n').find((line) => line.startsWith(name + ': '))?.slice(name.length + 2);
      const data = field('data');
      if (data) onFrame({id: field('id'), event: field('event'), data: JSON.parse(data)});
    }
  }
}
// Follows a stream for as long as `controller` is not aborted, reconnecting silently.
function follow(controller, at, path, onFrame, onConnect) {
  (async () => {
    while (!controller.signal.aborted) {
      onConnect?.();
      try { await sse(path(), sessions[at], controller.signal, onFrame); }
      catch (e) { if (confirmed(e)) return fail(at, e.message); }
      if (!controller.signal.aborted) await later(1000);
    }
  })();
}

function remember(id, token) {
  sessions[id] = token || sessions[id] || '';
  store.set('sessions', sessions);
}
// What the admin panels send: nothing while the sign-in cookie answers as the admin token
// (a session token typed for one session must not hide them), else the typed token.
const adminToken = () => signedIn ? '' : $('token').value.trim();
async function discover() {
  const admin = adminToken();
  // With the admin token: what --demo seeded, and every session that has executions.
  try {
    const demo = await api('GET', '/debug/demo', admin);
    for (const s of demo.sessions) if (!sessions[s.session_id]) remember(s.session_id, s.token);
  } catch (e) { /* no demo, or not the admin token */ }
  try {
    const found = await api('GET', '/debug/executions', admin);
    for (const row of found.sessions) if (!sessions[row.session_id]) remember(row.session_id, admin);
  } catch (e) { /* a session token: nothing to discover */ }
  renderSessions();
}
// Each session by what it was asked and when (the execution the overview puts first, read
// once with the admin token), its id short; the whole id on hover.
const sessionWords = {};
function renderSessions() {
  const ids = Object.keys(sessions);
  $('sessions').innerHTML = ids.map((id) => {
    const words = sessionWords[id];
    const said = words?.request ? esc(words.request.slice(0, 60)) : '<span class="muted">(no message yet)</span>';
    return `<div><button class="session${id === sid ? ' on' : ''}" data-sid="${esc(id)}" title="${esc(id)}" ${id === sid ? 'aria-current="true"' : ''}>${said}<br>
      <span class="muted">${esc(short(id))}${words?.at ? ' · ' + when(words.at) : ''}</span></button></div>`;
  }).join('') || 'none yet';
  document.querySelectorAll('button.session').forEach((b) => b.onclick = () => openSession(b.dataset.sid));
  describeSessions(ids.slice(0, 30).filter((id) => !(id in sessionWords)));
}
// The first thirty sessions' words, each read once (opening a session reads it again).
async function describeSessions(ids) {
  const admin = adminToken();
  if (!ids.length || (!admin && !signedIn)) return;
  for (const id of ids) sessionWords[id] = null;
  for (const id of ids) {
    try {
      const newest = (await api('GET', `/debug/overview?session=${id}&limit=1`, admin)).executions[0];
      sessionWords[id] = newest ? {request: newest.request, at: newest.admitted_ms} : {};
    } catch (e) { ids.forEach((left) => { if (sessionWords[left] === null) delete sessionWords[left]; }); return; }
  }
  renderSessions();
}

// At most one pending run of `task` by `name`, `ms` from the first ask.
const timers = {};
function soon(name, task, ms) { if (!timers[name]) timers[name] = setTimeout(() => { timers[name] = null; task(); }, ms); }
