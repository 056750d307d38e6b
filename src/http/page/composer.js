// The composer: starts an agent turn (a message) or a durable function (its name, revision and
// input, the input checked as JSON before anything is sent), either as a Job holding the
// resources it asks for (read from the queue), and, while a turn of the session runs, says
// what a message does then (waits in line, steers it, or interrupts it). Its draft is kept
// across reloads (sessionStorage) and never moved by a request arriving.
const COMPOSER = ['start-kind', 'message', 'continue', 'script', 'fn-name', 'fn-revision', 'fn-input', 'as-job', 'when-busy'];
const valueOf = (input) => input.type === 'checkbox' ? input.checked : input.value;
function saveComposer() {
  const draft = Object.fromEntries(COMPOSER.map((id) => [id, valueOf($(id))]));
  draft.units = Object.fromEntries([...document.querySelectorAll('#job-resources input')].map((i) => [i.dataset.resource, i.value]));
  store.set('composer', draft);
}
function restoreComposer() {
  const draft = store.get('composer', null);
  if (!draft) return;
  for (const id of COMPOSER) {
    if (draft[id] === undefined) continue;
    if ($(id).type === 'checkbox') $(id).checked = draft[id]; else $(id).value = draft[id];
  }
}
// Shows the fields of what is being started, and the busy choice while a turn runs.
function composerShape() {
  const fn = $('start-kind').value === 'function';
  $('agent-fields').hidden = fn;
  $('function-fields').hidden = !fn;
  $('job-fields').hidden = !$('as-job').checked;
  $('busy').hidden = fn || $('as-job').checked || !sessionBusy();
}
// A turn of the open session has not ended (from its Activity).
const sessionBusy = () => (activity?.in_progress ?? []).some((row) => row.details.some((d) => ['running', 'queued', 'waiting', 'cancelling'].includes(d.state)));
// What a start may ask for: the resources (for a Job's units) and the functions (names).
async function loadCatalog() {
  const admin = adminToken();
  if (!admin && !signedIn) return;
  const units = store.get('composer', {})?.units ?? {};
  try {
    const resources = await api('GET', '/v1/resources', admin);
    $('job-resources').innerHTML = resources.map((r) => `<label>${esc(r.name)} <span class="muted">(${r.capacity} in all)</span>
      <input type="number" min="0" max="${r.capacity}" step="1" data-resource="${esc(r.name)}" value="${esc(units[r.name] ?? '')}" aria-label="Units of ${esc(r.name)}"></label>`).join('') ||
      'no resources declared (serve --resource NAME=CAPACITY)';
  } catch (e) { /* a session token: the units cannot be listed */ }
  try {
    const functions = await api('GET', '/v1/functions', admin);
    $('fn-names').innerHTML = functions.map((f) => `<option value="${esc(f.name)}">revisions ${f.revisions.join(', ')}</option>`).join('');
  } catch (e) { /* a session token: names are typed */ }
}
// The start body the composer's fields make, or a sentence saying what is wrong.
function startBody() {
  const body = {};
  if ($('start-kind').value === 'function') {
    $('fn-input-error').textContent = '';
    if (!$('fn-name').value.trim()) return 'name the function';
    try { body.input = JSON.parse($('fn-input').value || 'null'); } catch (e) { $('fn-input-error').textContent = 'not JSON: ' + e.message; return 'the input is not JSON'; }
    Object.assign(body, {kind: 'function', function: $('fn-name').value.trim()});
    if ($('fn-revision').value) body.revision = Number($('fn-revision').value);
  } else {
    try { body.script = JSON.parse($('script').value); } catch (e) { return 'the script is not JSON'; }
    Object.assign(body, {kind: 'agent', message: $('message').value});
    const newest = [...transcript].reverse().find((m) => m.role === 'assistant');
    if ($('continue').checked && newest) body.parent_message_id = newest.message_id;
    if (!$('busy').hidden) body.when_busy = $('when-busy').value;
  }
  if ($('as-job').checked) {
    const resources = Object.fromEntries([...document.querySelectorAll('#job-resources input')]
      .filter((i) => Number(i.value) > 0).map((i) => [i.dataset.resource, Number(i.value)]));
    if (!Object.keys(resources).length) return 'a Job asks for at least one unit of a resource';
    body.job = {resources};
  }
  return body;
}
$('composer').oninput = () => { saveComposer(); composerShape(); };
$('composer').onchange = () => { saveComposer(); composerShape(); };
// The resources' units and the functions' names are read when first wanted.
$('as-job').addEventListener('change', () => { if (!document.querySelector('#job-resources input')) loadCatalog(); });
$('start-kind').addEventListener('change', () => { if (!$('fn-names').children.length) loadCatalog(); });
$('composer').onsubmit = async (event) => {
  event.preventDefault();
  const at = sid;
  if (!at) return say('open a session first');
  const body = startBody();
  if (typeof body === 'string') return say(body);
  try {
    const started = await api('POST', `/v1/sessions/${at}/executions`, sessions[at], body);
    if (at !== sid) return;
    delete sessionWords[at];
    renderSessions();
    loadActivity();
    openExecution(started.execution_id);
    if (started.steered) say(`steered the running turn ${started.execution_id}`);
  } catch (e) { fail(at, 'start: ' + e.message); }
};
