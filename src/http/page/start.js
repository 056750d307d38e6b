// The navigation's controls (token, sessions, starting an execution) and the page's start.
$('save').onclick = () => { store.set('token', $('token').value.trim()); discover(); followLog(); };
$('openSession').onclick = () => {
  const id = $('session-id').value.trim(), token = $('token').value.trim();
  if (!id) return say('enter a session id');
  if (token) remember(id, token);
  if (!(id in sessions) && !signedIn) return say('enter a token for this session');
  remember(id, token);
  openSession(id);
};
$('newSession').onclick = async () => {
  try { const s = await api('POST', '/v1/sessions', adminToken()); remember(s.session_id, s.token); openSession(s.session_id); }
  catch (e) { say('new session: ' + e.message); }
};
$('start').onclick = async () => {
  const at = sid;
  if (!at) return say('open a session first');
  let script;
  try { script = JSON.parse($('script').value); } catch (e) { return say('the script is not JSON'); }
  let job = null;
  if ($('job').value.trim()) {
    try { job = {resources: JSON.parse($('job').value)}; } catch (e) { return say('the Job resources are not JSON'); }
  }
  try {
    const body = {kind: 'agent', message: $('message').value, script};
    const newest = [...transcript].reverse().find((m) => m.role === 'assistant');
    if ($('continue').checked && newest) body.parent_message_id = newest.message_id;
    if (job) body.job = job;
    const started = await api('POST', `/v1/sessions/${at}/executions`, sessions[at], body);
    if (at === sid) { loadActivity(); openExecution(started.execution_id); }
  } catch (e) { fail(at, 'start: ' + e.message); }
};
renderSessions();
discover();
loadQueue();
// Signed in by the link `serve` printed? Then no token is needed (the cookie answers).
(async () => {
  try { await api('GET', '/debug/overview?limit=1', ''); signedIn = true; } catch (e) { /* not signed in */ }
  if (signedIn) { say('signed in'); discover(); followLog(); loadQueue(); loadOverview(); }
  if (store.get('session', '') in sessions) openSession(store.get('session', ''));
})();
