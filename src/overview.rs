//! Issue 36: executions across sessions for an operator — filtered by state, kind, session
//! and age, found by any id, "needs attention" first (`GET /debug/overview`, `openprogram
//! inspect executions`, `ctl --where`). An admin read of the store: the candidates come from
//! an index (a session's executions, a live state's, or the by-session index for all), and
//! each candidate's head is read until `limit` match.

use std::collections::BTreeSet;
use std::str::FromStr;

use openprogram_storage::{
    CommandId, EffectId, EventReader, ExecutionHead, ExecutionId, ExecutionKind, ExecutionState,
    ProcessId, SessionId, WaitId,
};
use serde::Serialize;

use crate::{Error, Result};

/// What to list; every field narrows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverviewFilter {
    pub state: Option<ExecutionState>,
    /// `agent`, `job` or `function`.
    pub kind: Option<ExecutionKind>,
    pub session: Option<SessionId>,
    /// Only executions admitted at or after this time (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Any id: of an execution, a session, an effect, a wait, a command or a process.
    pub id: Option<String>,
    /// Words its request holds (any case): of an agent turn's message, or a function's name
    /// and input. `TEXT_SCAN_MAX` requests are read at most: the unfinished executions', then
    /// the ended ones', newest first.
    pub text: Option<String>,
    pub limit: usize,
}

/// How many requests a search by words reads at most.
pub const TEXT_SCAN_MAX: usize = 5_000;

/// How much of a request a row shows.
const REQUEST_CHARS: usize = 120;

/// The most rows one read returns.
pub const OVERVIEW_LIMIT_MAX: usize = 1000;

/// One execution as the overview lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverviewRow {
    pub execution_id: ExecutionId,
    pub session_id: SessionId,
    pub kind: &'static str,
    pub state: &'static str,
    pub pause_reason: Option<String>,
    pub version: u64,
    /// When it was admitted (its id's time) and last changed, ms since the epoch.
    pub admitted_ms: u64,
    pub last_activity_ms: u64,
    /// Waiting for a person: an approval or question, a pause, an effect to reconcile (B-3).
    pub needs_attention: bool,
    /// What it was asked, its first `REQUEST_CHARS` characters: an agent turn's message, a
    /// function's name and input; empty when its first event is no admission.
    pub request: String,
}

pub fn kind_name(kind: ExecutionKind) -> &'static str {
    match kind {
        ExecutionKind::AgentTurn => "agent",
        ExecutionKind::Job => "job",
        ExecutionKind::Function => "function",
    }
}

/// `agent`, `job` or `function` (`kind_name`'s); `None` for anything else.
pub fn parse_kind(kind: &str) -> Option<ExecutionKind> {
    let kinds = [
        ExecutionKind::AgentTurn,
        ExecutionKind::Job,
        ExecutionKind::Function,
    ];
    kinds.into_iter().find(|known| kind_name(*known) == kind)
}

/// A state by its contract name.
pub fn parse_state(state: &str) -> Option<ExecutionState> {
    ExecutionState::ALL
        .into_iter()
        .find(|candidate| candidate.as_str() == state)
}

fn needs_attention(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Waiting | ExecutionState::Paused | ExecutionState::ReconciliationRequired
    )
}

/// How a row sorts: needs attention, then running work, then ended; newest activity first.
fn rank(row: &OverviewRow, state: ExecutionState) -> (u8, std::cmp::Reverse<u64>) {
    let group = match (row.needs_attention, state.is_terminal()) {
        (true, _) => 0,
        (false, false) => 1,
        (false, true) => 2,
    };
    (group, std::cmp::Reverse(row.last_activity_ms))
}

/// The executions `filter` selects, needs attention first.
///
/// Unfinished executions come from the by-state index (the attention states, then the
/// running ones), so the first group is always whole however many others there are. Ended
/// ones are not indexed by state: candidates from the by-session index (or the filter's
/// session, or id) are read newest admitted first, only as far as `limit` ended rows, or
/// past `since` (ids are time-ordered).
pub fn overview(store: &dyn EventReader, filter: &OverviewFilter) -> Result<Vec<OverviewRow>> {
    let limit = filter.limit.clamp(1, OVERVIEW_LIMIT_MAX);
    let mut rows: Vec<((u8, std::cmp::Reverse<u64>), OverviewRow)> = Vec::new();
    let words = filter
        .text
        .as_deref()
        .map(|text| text.trim().to_lowercase());
    // A search by words reads each candidate's request: `TEXT_SCAN_MAX` of them at most.
    let searched = std::cell::Cell::new(0);
    let push = |head: &ExecutionHead, rows: &mut Vec<_>| -> Result<()> {
        let Some(mut row) = row_if(head, kind_of(store, head)?, filter) else {
            return Ok(());
        };
        if let Some(words) = &words {
            if searched.replace(searched.get() + 1) >= TEXT_SCAN_MAX {
                return Ok(());
            }
            let request = request_of(store, head.execution_id)?;
            if !request.to_lowercase().contains(words.as_str()) {
                return Ok(());
            }
            row.request = cut(request);
        }
        rows.push((rank(&row, head.state), row));
        Ok(())
    };
    let unfinished: Vec<ExecutionState> = ExecutionState::ALL
        .into_iter()
        .filter(|state| !state.is_terminal() && filter.state.is_none_or(|want| want == *state))
        .collect();
    let indexed = filter.id.is_none() && filter.session.is_none();
    if indexed {
        for state in &unfinished {
            for execution_id in store.executions_in_state(*state)? {
                if let Some(head) = store.head(execution_id)? {
                    push(&head, &mut rows)?;
                }
            }
        }
    }
    let wants_ended = filter.state.is_none_or(ExecutionState::is_terminal);
    if wants_ended || !indexed {
        let mut ended = 0;
        // Newest first: ids are time-ordered.
        for execution_id in candidates(store, filter)?.into_iter().rev() {
            if words.is_some() && searched.get() >= TEXT_SCAN_MAX {
                break;
            }
            let Some(head) = store.head(execution_id)? else {
                continue; // purged since it was indexed
            };
            if indexed && !head.state.is_terminal() {
                continue; // read from the state index above
            }
            let before = rows.len();
            push(&head, &mut rows)?;
            if rows.len() > before && head.state.is_terminal() {
                ended += 1;
            }
            let admitted = admitted_ms(&head);
            if ended >= limit || filter.since_ms.is_some_and(|since| admitted < since) {
                break;
            }
        }
    }
    rows.sort_by_key(|(rank, _)| *rank);
    let mut rows: Vec<OverviewRow> = rows.into_iter().take(limit).map(|(_, row)| row).collect();
    if filter.text.is_none() {
        for row in &mut rows {
            row.request = cut(request_of(store, row.execution_id)?);
        }
    }
    Ok(rows)
}

/// A request as a row shows it: its first `REQUEST_CHARS`.
fn cut(request: String) -> String {
    match request.char_indices().nth(REQUEST_CHARS) {
        Some((end, _)) => request[..end].to_owned(),
        None => request,
    }
}

/// What an execution was asked, from its admission (its first event): an agent turn's
/// message, or a function's name and input; empty when its first event is no admission.
fn request_of(store: &dyn EventReader, execution_id: ExecutionId) -> Result<String> {
    let first = store.events_after(execution_id, 0, 1)?;
    Ok(match first.first().map(|envelope| &envelope.event) {
        Some(openprogram_storage::Event::Admitted { kind, input, .. }) => {
            openprogram_actors::transcript::request_text(*kind, input)
        }
        _ => String::new(),
    })
}

/// When an execution was admitted: its id's time (UUID v7), ms since the epoch.
fn admitted_ms(head: &ExecutionHead) -> u64 {
    head.execution_id
        .as_uuid()
        .get_timestamp()
        .map_or(0, |time| {
            let (seconds, nanos) = time.to_unix();
            seconds * 1000 + u64::from(nanos) / 1_000_000
        })
}

/// What the overview calls an execution: a Job if it was admitted as one (it keeps the
/// kind of what it runs, an agent turn or a function, and has a Job record), else its kind.
fn kind_of(store: &dyn EventReader, head: &ExecutionHead) -> Result<ExecutionKind> {
    if head.kind == ExecutionKind::Job || store.job(head.execution_id)?.is_some() {
        return Ok(ExecutionKind::Job);
    }
    Ok(head.kind)
}

fn row_if(
    head: &ExecutionHead,
    kind: ExecutionKind,
    filter: &OverviewFilter,
) -> Option<OverviewRow> {
    let admitted_ms = admitted_ms(head);
    let keep = filter.state.is_none_or(|state| state == head.state)
        && filter.kind.is_none_or(|want| want == kind)
        && filter
            .session
            .is_none_or(|session| session == head.session_id)
        && filter.since_ms.is_none_or(|since| admitted_ms >= since);
    keep.then(|| OverviewRow {
        execution_id: head.execution_id,
        session_id: head.session_id,
        kind: kind_name(kind),
        state: head.state.as_str(),
        pause_reason: head.pause_reason.clone(),
        version: head.version,
        admitted_ms,
        last_activity_ms: head.last_activity_ms,
        needs_attention: needs_attention(head.state),
        request: String::new(),
    })
}

/// The executions worth reading, oldest first: an id's, a session's, or every session's.
fn candidates(store: &dyn EventReader, filter: &OverviewFilter) -> Result<Vec<ExecutionId>> {
    if let Some(id) = &filter.id {
        return by_id(store, id.trim());
    }
    if let Some(session) = filter.session {
        return Ok(store.executions_in_session(session)?);
    }
    let mut ids = BTreeSet::new();
    for (session, _) in store.sessions()? {
        ids.extend(store.executions_in_session(session)?);
    }
    Ok(ids.into_iter().collect())
}

/// The executions an id names: itself, a session's, or the one a record belongs to (a bare
/// UUID is tried as an execution, a session and a command). An id that parses as none of
/// them is a usage error; one that names nothing finds nothing.
fn by_id(store: &dyn EventReader, id: &str) -> Result<Vec<ExecutionId>> {
    let prefixed = |prefix: &str| {
        id.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('_'))
    };
    let one = |execution: Option<ExecutionId>| Ok(execution.into_iter().collect());
    let bare = uuid::Uuid::parse_str(id).is_ok();
    if prefixed(ExecutionId::PREFIX) || bare {
        if let Ok(execution) = ExecutionId::from_str(id) {
            if !bare || store.head(execution)?.is_some() {
                return one(Some(execution));
            }
        }
    }
    if prefixed(SessionId::PREFIX) || bare {
        if let Ok(session) = SessionId::from_str(id) {
            let executions = store.executions_in_session(session)?;
            if !bare || !executions.is_empty() {
                return Ok(executions);
            }
        }
    }
    if prefixed(EffectId::PREFIX) {
        if let Ok(effect) = EffectId::from_str(id) {
            return one(store.receipt(effect)?.map(|receipt| receipt.execution_id));
        }
    }
    if prefixed(WaitId::PREFIX) {
        if let Ok(wait) = WaitId::from_str(id) {
            return one(store.wait(wait)?.map(|wait| wait.execution_id));
        }
    }
    if prefixed(ProcessId::PREFIX) {
        if let Ok(process) = ProcessId::from_str(id) {
            return one(store.process(process)?.map(|process| process.execution_id));
        }
    }
    if prefixed(CommandId::PREFIX) || bare {
        if let Ok(command) = CommandId::from_str(id) {
            return one(store.command(command)?.map(|command| command.execution_id));
        }
    }
    Err(Error::InvalidRequest(format!(
        "`{id}` is no id of an execution, session, effect, wait, command or process"
    )))
}

/// A duration like `500ms`, `10s`, `30m`, `12h` or `7d`.
pub fn parse_duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    let invalid = || format!("invalid duration `{text}`: use one like 10s, 30m, 12h or 7d");
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let amount: u64 = text[..digits].parse().map_err(|_| invalid())?;
    let millis_per = match &text[digits..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(invalid()),
    };
    amount
        .checked_mul(millis_per)
        .map(std::time::Duration::from_millis)
        .ok_or_else(invalid)
}
