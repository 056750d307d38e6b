// The operator's panels: every session's executions (filtered, found by words or id), the
// global log's stream that keeps them current, and the resource queue.
// Every session's executions (issue 36, admin token): filtered, found by any id, needs
// attention first; read again whenever the global log moves (its event stream) and whenever a
// filter changes. Opening one opens its session with the admin token.
// One read at a time: asked again while one is in flight, it reads once more after it, and
// only the newest filters' answer is drawn.
let overviewReading = false, overviewAgain = false;
async function loadOverview() {
  const admin = adminToken();
  if (!admin && !signedIn) return;
  if (overviewReading) { overviewAgain = true; return; }
  overviewReading = true;
  const query = filtersToUrl();
  query.set('limit', '50');
  try {
    const found = await api('GET', '/debug/overview?' + query, admin);
    if (String(filtersToUrl(false)) !== String(withoutLimit(query))) return;
    $('overview').innerHTML = found.executions.map(overviewRow).join('') || '<tr><td class="muted">none match</td></tr>';
    const counts = {};
    for (const row of found.executions) counts[row.state] = (counts[row.state] || 0) + 1;
    $('ov-counts').innerHTML = (found.executions.length ? 'shown: ' : '') + Object.entries(counts).map(([state, n]) => `<span class="chip st-${esc(state)}" data-count="${esc(state)}">${esc(state.replace(/_/g, ' '))} ${n}</span>`).join(' ');
    document.querySelectorAll('button.ov-open').forEach((b) => b.onclick = () => {
      if (!sessions[b.dataset.sid]) remember(b.dataset.sid, admin);
      openSession(b.dataset.sid); openExecution(b.dataset.eid);
    });
    document.querySelectorAll('#overview button.copy').forEach((b) => b.onclick = () => copyId(b));
  } catch (e) {
    const text = e.status === 401 ? 'the admin token shows them' : 'overview: ' + e.message;
    $('overview').innerHTML = `<tr><td class="muted">${esc(text)}</td></tr>`;
  } finally {
    overviewReading = false;
    if (overviewAgain) { overviewAgain = false; loadOverview(); }
  }
}
const withoutLimit = (query) => { const copy = new URLSearchParams(query); copy.delete('limit'); return copy; };
// One row a person can scan: what it was asked, its state as a coloured chip, when, and its
// id short, with the whole id one click away (copied).
function overviewRow(row) {
  const asked = row.request ? esc(row.request) : '<span class="muted">(no message)</span>';
  return `<tr class="${row.needs_attention ? 'attention' : ''}" data-eid="${esc(row.execution_id)}" data-state="${esc(row.state)}">
    <td><button class="ov-open" data-eid="${esc(row.execution_id)}" data-sid="${esc(row.session_id)}" aria-label="Open ${esc(row.request || row.execution_id)}">${asked}</button><br>
    <span class="chip st-${esc(row.state)}">${esc(row.state.replace(/_/g, ' '))}</span>${row.needs_attention ? ' <b>needs attention</b>' : ''}
    <span class="muted">· ${esc(row.kind)} · ${when(row.admitted_ms)} ·</span> ${shortId(row.execution_id)}</td></tr>`;
}
// "3 min ago", the exact time on hover.
function when(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  const ago = s < 45 ? 'just now' : s < 3600 ? `${Math.round(s / 60)} min ago` : s < 86400 ? `${Math.round(s / 3600)} h ago` : `${Math.round(s / 86400)} d ago`;
  const exact = new Date(ms);
  return `<time datetime="${exact.toISOString()}" title="${esc(exact.toLocaleString())}">${ago}</time>`;
}
// An id short (`short`), and a button that copies all of it.
function shortId(id) {
  return `<code title="${esc(id)}">${esc(short(id))}</code> <button type="button" class="copy" data-copy="${esc(id)}" aria-label="Copy the id ${esc(id)}">copy</button>`;
}
async function copyId(button) {
  try { await navigator.clipboard.writeText(button.dataset.copy); button.textContent = 'copied'; }
  catch (e) { say('copy: select the id instead — ' + button.dataset.copy); }
}
// The overview's filters live in the page's address, so a view can be shared.
const FILTERS = [['state', 'ov-state'], ['kind', 'ov-kind'], ['since', 'ov-since'], ['id', 'ov-id'], ['text', 'ov-text']];
// The filters as a query; written into the page's address unless `address` is false.
function filtersToUrl(address = true) {
  const query = new URLSearchParams();
  for (const [key, id] of FILTERS) if ($(id).value.trim()) query.set(key, $(id).value.trim());
  if (address) history.replaceState(null, '', query.size ? '?' + query : location.pathname);
  return query;
}
for (const [key, id] of FILTERS) {
  const value = new URLSearchParams(location.search).get(key);
  if (value) $(id).value = value;
}
for (const id of ['ov-state', 'ov-kind', 'ov-since']) $(id).onchange = loadOverview;
for (const id of ['ov-id', 'ov-text']) $(id).oninput = () => soon('overview', loadOverview, 300);
// Live: the global log's stream from its end, each batch of events a reason to read the
// overview again; reconnects quietly where it stopped, stops on a refusal.
let logStream = null;
function followLog() {
  logStream?.abort();
  const admin = adminToken();
  if (!admin && !signedIn) return;
  const controller = logStream = new AbortController();
  let position = null;
  (async () => {
    while (!controller.signal.aborted) {
      try {
        const from = position === null ? '' : `?after=${position}`;
        await sse(`/debug/log/stream${from}`, admin, controller.signal, (frame) => {
          if (frame.id) position = Number(frame.id);
          soon('overview', loadOverview, 1000);
        });
      } catch (e) { if (confirmed(e)) return; }
      if (!controller.signal.aborted) await later(1000);
    }
  })();
  loadOverview();
}
followLog();

// The resource queue (J-1, admin token): each resource's capacity, units in use, and the
// Jobs waiting for it in the order they are served; read again every two seconds.
async function loadQueue() {
  const admin = adminToken();
  if (!admin && !signedIn) return;
  try {
    const resources = await api('GET', '/v1/resources', admin);
    $('queue').innerHTML = resources.map((r) => `<div data-resource="${esc(r.name)}"><strong>${esc(r.name)}</strong>
      <span data-in-use>${r.in_use}</span> of ${r.capacity} in use · <span data-queued>${r.queued}</span> waiting
      ${r.waiting.length ? '<ol>' + r.waiting.slice(0, 20).map((id) => `<li>${esc(id)}</li>`).join('') + '</ol>' : ''}</div>`).join('') || 'no resources declared (serve --resource NAME=CAPACITY)';
  } catch (e) { $('queue').textContent = e.status === 401 ? 'the admin token shows it' : 'queue: ' + e.message; }
}
setInterval(loadQueue, 2000);

// Live figures (admin): small charts of the server's samples of the last ten minutes —
// steps per second on this node, executions not ended by state, Jobs waiting for resources.
async function loadFigures() {
  const admin = adminToken();
  if (!admin && !signedIn) return;
  try {
    const {samples} = await api('GET', '/debug/figures', admin);
    const at = (s) => s.at_ms;
    const rates = samples.slice(1).map((s, i) => ({at: at(s), value: Math.max(0, (s.steps - samples[i].steps) * 1000 / Math.max(1, at(s) - at(samples[i])))}));
    // Each state that had executions in the window; a sample whose index was unreadable
    // (no counts) is left out rather than drawn as zeros.
    const counted = samples.filter((s) => Object.keys(s.by_state).length);
    const names = [...new Set(counted.flatMap((s) => Object.keys(s.by_state).filter((k) => s.by_state[k] > 0)))];
    const states = (names.length ? names : ['running']).map((state) => [state, counted.map((s) => ({at: at(s), value: s.by_state[state] ?? 0}))]);
    $('figures').innerHTML = chart('steps', 'steps per second', [['steps', rates]]) +
      chart('states', 'executions not ended', states) +
      chart('jobs', 'Jobs waiting for resources', [['jobs', samples.map((s) => ({at: at(s), value: s.jobs_waiting}))]]);
  } catch (e) { $('figures').textContent = e.status === 401 ? 'the admin token shows them' : 'figures: ' + e.message; }
}
const figure = (value) => value == null ? '—' : value >= 100 ? Math.round(value).toLocaleString() : String(Math.round(value * 10) / 10);
// One chart: a line per series over the samples' times, the newest values said in words.
function chart(name, title, series) {
  const all = series.flatMap(([, points]) => points), W = 200, H = 40;
  const t0 = Math.min(...all.map((p) => p.at)), t1 = Math.max(...all.map((p) => p.at)), max = Math.max(1, ...all.map((p) => p.value));
  const x = (t) => t1 > t0 ? (t - t0) / (t1 - t0) * W : W, y = (v) => H - 1 - v / max * (H - 2);
  const now = series.map(([label, points]) => [label, points.at(-1)?.value]);
  const said = now.map(([label, value]) => series.length > 1 ? `${label.replace(/_/g, ' ')} ${figure(value)}` : figure(value)).join(', ');
  const lines = series.map(([label, points]) => points.length > 1
    ? `<polyline class="line s-${esc(label)}" points="${points.map((p) => `${x(p.at).toFixed(1)},${y(p.value).toFixed(1)}`).join(' ')}"/>`
    : points.map((p) => `<circle class="line s-${esc(label)}" cx="${x(p.at).toFixed(1)}" cy="${y(p.value).toFixed(1)}" r="2"/>`).join('')).join('');
  return `<figure class="chart" data-figure="${name}"${now.map(([label, value]) => ` data-${esc(label)}="${value ?? ''}"`).join('')}>
    <figcaption>${esc(title)}: <b>${esc(said)}</b> <span class="muted">(peak ${figure(max)})</span></figcaption>
    <svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img" aria-label="${esc(title)} over the last minutes: now ${esc(said)}, peak ${figure(max)}">${lines}</svg></figure>`;
}
