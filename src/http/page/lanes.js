// An execution's lanes: where its time went, one lane per attempt, drawn as SVG.
// Where the time went (issue 55): one lane per attempt; a bar per model call, tool call and
// function step from the event that started it to the one that ended it (a call recorded
// only by its result starts at the event before it), coloured by outcome; a wait for a
// person as an outlined gap that says whom it waits for. Drawn from the events alone.
const snake = (text) => String(text ?? '').replace(/([a-z])([A-Z])/g, '$1_$2').toLowerCase();
function spans(all, toolOf) {
  const open = new Map(), out = [];
  let lane = all.find((e) => e.type === 'attempt_started')?.epoch ?? 1, before = null;
  const start = (key, e, kind, name) => open.set(key, {kind, name, lane, start: e.at_ms, seq: e.seq});
  const end = (key, e, outcome, kind, name) => {
    const span = open.get(key) ?? {kind, name, lane, start: (before ?? e).at_ms, seq: e.seq};
    open.delete(key);
    out.push({...span, end: e.at_ms, outcome});
  };
  for (const e of all) {
    if (e.type === 'attempt_started') {
      // A call its attempt left open ended with it: interrupted (a wait goes on).
      for (const [key, span] of open) if (span.kind !== 'wait') { open.delete(key); out.push({...span, end: e.at_ms, outcome: 'interrupted'}); }
      lane = e.epoch;
    }
    else if (e.type === 'model_requested') start(e.effect_id, e, 'model', 'model call');
    else if (e.type === 'model_decided') end(e.effect_id, e, 'confirmed', 'model', 'model call');
    else if (e.type === 'model_failed') end(e.effect_id, e, 'failed', 'model', 'model call');
    else if (e.type === 'tool_dispatched') start(e.effect_id, e, 'tool', e.tool);
    else if (e.type === 'tool_finished') end(e.effect_id, e, snake(e.status), 'tool', toolOf(e.effect_id) ?? 'tool call');
    else if (e.type === 'step_started') start(e.effect_id, e, 'step', 'step ' + e.step_id);
    else if (e.type === 'step_finished') end(e.effect_id, e, snake(e.status), 'step', 'step ' + e.step_id);
    else if (e.type === 'wait_opened') start(e.wait_id, e, 'wait', `a person: ${snake(e.kind)} “${e.prompt}”`);
    else if (e.type === 'wait_changed' && open.has(e.wait_id) && snake(e.status) !== 'open') end(e.wait_id, e, snake(e.status));
    before = e;
  }
  // Still open at the last event: in flight, or waiting.
  const last = all.at(-1)?.at_ms ?? 0;
  for (const span of open.values()) out.push({...span, end: last, outcome: span.kind === 'wait' ? 'waiting' : 'in_flight'});
  return out.sort((a, b) => a.start - b.start || a.seq - b.seq);
}
const duration = (ms) => ms < 1000 ? `${ms} ms` : ms < 60_000 ? `${(ms / 1000).toFixed(1)} s` : `${(ms / 60_000).toFixed(1)} min`;
// `toolOf`: a tool call's tool by its effect id (the snapshot's receipts), for calls
// recorded only by their result.
function lanesSvg(all, toolOf) {
  const bars = spans(all, toolOf);
  if (!bars.length) return '';
  const lanes = [...new Set(all.filter((e) => e.type === 'attempt_started').map((e) => e.epoch))];
  if (!lanes.length) lanes.push(bars[0].lane);
  const t0 = all[0].at_ms, total = Math.max(1, all.at(-1).at_ms - t0);
  const W = 600, left = 70, H = 26, x = (t) => left + (t - t0) / total * (W - left - 10);
  const rows = lanes.map((epoch, i) => {
    // Waits first: a call that ends where a wait begins is drawn over it, and answers a pointer.
    const y = 6 + i * H, mine = bars.filter((bar) => bar.lane === epoch)
      .sort((a, b) => (b.kind === 'wait') - (a.kind === 'wait'));
    return `<g class="lane" data-attempt="${esc(epoch)}"><text x="0" y="${y + 13}" class="lane-label">attempt ${esc(epoch)}</text>` +
      mine.map((bar) => {
        const x0 = x(bar.start), width = Math.max(3, x(bar.end) - x0), title = `${bar.name} · ${bar.outcome.replace(/_/g, ' ')} · ${duration(bar.end - bar.start)}`;
        const label = bar.kind === 'wait' && width > 80 ? `<text x="${x0 + 4}" y="${y + 14}" class="gap-label">${esc(bar.name.slice(0, Math.floor(width / 7)))}</text>` : '';
        return `<rect class="bar k-${bar.kind} o-${esc(bar.outcome)}" x="${x0.toFixed(1)}" y="${y + 2}" width="${width.toFixed(1)}" height="16" tabindex="0"
          data-kind="${bar.kind}" data-outcome="${esc(bar.outcome)}" data-start="${bar.start}" data-end="${bar.end}" data-seq="${bar.seq}"><title>${esc(title)}</title></rect>${label}`;
      }).join('') + '</g>';
  }).join('');
  const height = 6 + lanes.length * H + 16;
  return `<svg id="lanes" viewBox="0 0 ${W} ${height}" width="100%" role="img" aria-label="Where the time went: ${lanes.length} attempt${lanes.length === 1 ? '' : 's'}, ${bars.length} steps over ${duration(total)}">
    ${rows}<text x="${left}" y="${height - 3}" class="axis">0</text><text x="${W - 10}" y="${height - 3}" class="axis" text-anchor="end">${duration(total)}</text></svg>`;
}
// A bar's event in the table below: marked, unfolded, in view.
function pick(seq) {
  document.querySelectorAll('#timeline tr.picked').forEach((row) => row.classList.remove('picked'));
  const row = document.querySelector(`#timeline tr[data-seq="${CSS.escape(String(seq))}"]`);
  if (!row) return;
  row.classList.add('picked');
  const details = row.querySelector('details');
  if (details) details.open = true;
  row.scrollIntoView({block: 'center'});
}
