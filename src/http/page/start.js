// The navigation's controls (token, sessions) and the page's start.
$('save').onclick = () => { store.set('token', $('token').value.trim()); discover(); followLog(); loadCatalog(); loadFigures(); };
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
restoreComposer();
composerShape();
renderSessions();
discover();
loadQueue();
loadCatalog();
loadFigures();
setInterval(loadFigures, 10_000);
// Signed in by the link `serve` printed? Then no token is needed (the cookie answers).
(async () => {
  try { await api('GET', '/debug/overview?limit=1', ''); signedIn = true; } catch (e) { /* not signed in */ }
  if (signedIn) { say('signed in'); discover(); followLog(); loadQueue(); loadOverview(); loadCatalog(); loadFigures(); }
  if (store.get('session', '') in sessions) openSession(store.get('session', ''));
})();
