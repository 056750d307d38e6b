//! What an execution's state means, in words, for `inspect` (I-4): the state and its reason
//! as a person reads them (`paused — by a person`, `queued — behind turn X of its
//! session`), and the controls as `ctl` spells them.

use serde_json::Value;

/// The state of the snapshot `snapshot`, with why and what moves it on.
pub fn state_in_words(snapshot: &Value) -> String {
    let state = snapshot["state"].as_str().unwrap_or("unknown");
    let reason = snapshot["pause_reason"].as_str().unwrap_or_default();
    let why = match state {
        "queued" if snapshot["session_turn"]["queued"] == true => behind(&snapshot["session_turn"]),
        "queued" if !snapshot["job"].is_null() => match snapshot["job"]["queue_position"].as_u64() {
            Some(position) => format!("a Job waiting for its resources, {position} in line"),
            None => "a Job waiting for its resources".to_owned(),
        },
        "paused" => paused(reason, snapshot),
        "waiting" => {
            let open = (snapshot["waits"].as_array().into_iter().flatten())
                .find(|wait| wait["status"] == "open");
            match open {
                Some(wait) => format!(
                    "for a person: {} \"{}\" (approve, deny, or ctl answer)",
                    wait["kind"].as_str().unwrap_or("question"),
                    wait["prompt"].as_str().unwrap_or_default()
                ),
                None => "for a person's answer".to_owned(),
            }
        }
        "reconciliation_required" => "an effect's outcome is unknown: ctl reconcile says whether \
             it took effect (confirmed) or not (not-applied); it never runs again on a guess"
            .to_owned(),
        "expired" => "its restart window closed before a restart: ctl continue runs it".to_owned(),
        "cancelling" => "a cancel waits for the step in flight to end".to_owned(),
        _ => String::new(),
    };
    match why.is_empty() {
        true => state.to_owned(),
        false => format!("{state} — {why}"),
    }
}

/// What a turn waiting for its session waits behind.
fn behind(turn: &Value) -> String {
    let place = match turn["place"].as_u64() {
        Some(1) => " (next in line)".to_owned(),
        Some(place) => format!(" ({place} in line)"),
        None => String::new(),
    };
    match turn["behind"].as_str() {
        Some(holder) => format!(
            "behind turn {holder} of its session{place}: it runs once the session is free"
        ),
        None => format!("behind an earlier turn of its session{place}: it runs once that one ends"),
    }
}

/// Why a paused execution is paused, and what continues it.
fn paused(reason: &str, snapshot: &Value) -> String {
    match reason {
        "pause" => "by a person's pause: ctl continue resumes it".to_owned(),
        "step" => "after the one step a person asked for: ctl step or continue".to_owned(),
        "start_paused" => "admitted paused: ctl continue or step starts it".to_owned(),
        "fork" | "retry" => format!("a new child ({reason}): ctl continue starts it"),
        "restart_recovery" => "by an orderly shutdown: the next start resumes it within its \
             restart window"
            .to_owned(),
        "incompatible_revision" => "the runtime's contract (model, system text or tools) \
             changed since it started: ctl continue approves the new one"
            .to_owned(),
        "stale_checkpoint" => "its checkpoint is not the one its log leads to: ctl continue \
             or cancel"
            .to_owned(),
        "revision_missing" => "its function's revision is not registered (or its code \
             changed): register it again and ctl continue"
            .to_owned(),
        "version_conflict" => {
            let differences = (snapshot["function"]["differences"].as_array())
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ");
            format!("version conflict: the newest revision does not account for its steps: {differences}")
        }
        "budget_exhausted" => "its Job budget is spent: ctl continue with a larger budget".to_owned(),
        "" => String::new(),
        other => other.to_owned(),
    }
}

/// A control as `ctl` takes it (`stop-process`), from the API's name (`stop_process`).
pub fn control_word(kind: &str) -> String {
    kind.replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn i4_states_are_said_in_words_with_what_moves_them_on() {
        let queued = json!({"state": "queued", "session_turn": {"queued": true}});
        assert!(state_in_words(&queued).starts_with("queued — behind an earlier turn"));
        let named = json!({"state": "queued",
            "session_turn": {"queued": true, "behind": "e-1", "place": 2}});
        assert!(
            state_in_words(&named).starts_with("queued — behind turn e-1 of its session (2 in line)"),
            "{}",
            state_in_words(&named)
        );
        let paused = json!({"state": "paused", "pause_reason": "pause"});
        assert_eq!(state_in_words(&paused), "paused — by a person's pause: ctl continue resumes it");
        let conflict = json!({"state": "paused", "pause_reason": "version_conflict",
            "function": {"differences": ["step s3 has no counterpart"]}});
        assert!(state_in_words(&conflict).ends_with("step s3 has no counterpart"));
        let waiting = json!({"state": "waiting", "waits": [{"status": "open", "kind": "approval", "prompt": "ok?"}]});
        assert!(state_in_words(&waiting).contains("approval \"ok?\""));
        assert_eq!(state_in_words(&json!({"state": "completed"})), "completed");
        assert_eq!(control_word("stop_process"), "stop-process");
    }
}
